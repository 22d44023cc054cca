// The C++17 wrapper of specx.h: RAII handles, exceptions. Header-only, nothing but the C ABI
// underneath, so a service compiled with another compiler or standard library links the same
// libspecx.
//
//   specx::Model model("artifact/", specx::ModelOptions().threads(2));
//   specx::Params params;
//   params.max_new_tokens(64).k(4).drafter("draft");
//   specx::Generation gen(model, prompt_ids, params);
//   while (!gen.done()) for (int64_t id : gen.next()) emit(id);
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "specx.h"

namespace specx {

class Error : public std::runtime_error {
 public:
  Error(specx_code code, const std::string& message) : std::runtime_error(message), code_(code) {}
  specx_code code() const noexcept { return code_; }

 private:
  specx_code code_;
};

// Throw the status as an Error (and free it); nothing for a null (OK) status.
inline void check(specx_status* status) {
  if (status == nullptr) return;
  specx_code code = specx_status_code(status);
  std::string message = specx_status_message(status);
  specx_status_destroy(status);
  throw Error(code, message);
}

class ModelOptions {
 public:
  ModelOptions() { check(specx_model_options_create(&raw_)); holder_.reset(raw_); }
  ModelOptions& threads(int n) { check(specx_model_options_set_threads(raw_, n)); return *this; }
  ModelOptions& provider(const std::string& p) {
    check(specx_model_options_set_provider(raw_, p.c_str()));
    return *this;
  }  ModelOptions& device_id(int id) {
    check(specx_model_options_set_device_id(raw_, id));
    return *this;
  }

  ModelOptions& kernels_library(const std::string& path) {
    check(specx_model_options_set_kernels_library(raw_, path.c_str()));
    return *this;
  }
  const specx_model_options* get() const { return raw_; }

 private:
  struct Free { void operator()(specx_model_options* p) const { specx_model_options_destroy(p); } };
  specx_model_options* raw_ = nullptr;
  std::unique_ptr<specx_model_options, Free> holder_;
};

class Model {
 public:
  explicit Model(const std::string& folder, const ModelOptions& options = ModelOptions()) {
    specx_model* raw = nullptr;
    check(specx_model_load(folder.c_str(), options.get(), &raw));
    model_.reset(raw);
  }
  int64_t vocab_size() const { return specx_model_vocab_size(get()); }
  int64_t max_length() const { return specx_model_max_length(get()); }
  std::vector<int64_t> eos_ids() const {
    std::vector<int64_t> ids;
    for (size_t i = 0; i < specx_model_eos_count(get()); ++i) ids.push_back(specx_model_eos_id(get(), i));
    return ids;
  }
  std::vector<std::string> drafters() const {
    std::vector<std::string> names;
    for (size_t i = 0; i < specx_model_drafter_count(get()); ++i)
      names.emplace_back(specx_model_drafter_name(get(), i));
    return names;
  }
  std::string default_drafter() const { return specx_model_default_drafter(get()); }
  const specx_model* get() const { return model_.get(); }

 private:
  struct Free { void operator()(specx_model* p) const { specx_model_destroy(p); } };
  std::unique_ptr<specx_model, Free> model_;
};

// Token ids to UTF-8 text as they stream in (specx_detokenizer_*).
class Detokenizer {
 public:
  explicit Detokenizer(const Model& model) {
    specx_detokenizer* raw = nullptr;
    check(specx_detokenizer_create(model.get(), &raw));
    detokenizer_.reset(raw);
  }
  std::string push(const std::vector<int64_t>& ids) {
    const char* text = nullptr;
    size_t length = 0;
    check(specx_detokenizer_push(detokenizer_.get(), ids.data(), ids.size(), &text, &length));
    return std::string(text, length);
  }
  std::string finish() {
    const char* text = nullptr;
    size_t length = 0;
    check(specx_detokenizer_finish(detokenizer_.get(), &text, &length));
    return std::string(text, length);
  }

 private:
  struct Free { void operator()(specx_detokenizer* p) const { specx_detokenizer_destroy(p); } };
  std::unique_ptr<specx_detokenizer, Free> detokenizer_;
};

class Params {
 public:
  Params() { check(specx_params_create(&raw_)); holder_.reset(raw_); }
  Params& max_new_tokens(int64_t n) { check(specx_params_set_max_new_tokens(raw_, n)); return *this; }
  Params& k(int k) { check(specx_params_set_k(raw_, k)); return *this; }
  Params& max_k(int k) { check(specx_params_set_max_k(raw_, k)); return *this; }
  Params& drafter(const std::string& name) {
    check(specx_params_set_drafter(raw_, name.c_str()));
    return *this;
  }
  Params& stop_ids(const std::vector<int64_t>& ids) {
    check(specx_params_set_stop_ids(raw_, ids.data(), ids.size()));
    return *this;
  }
  Params& sampling(double temperature, int top_k = 0, double top_p = 1.0, double min_p = 0.0) {
    check(specx_params_set_sampling(raw_, temperature, top_k, top_p, min_p));
    return *this;
  }
  Params& seed(uint64_t seed) { check(specx_params_set_seed(raw_, seed)); return *this; }
  Params& verification(const std::string& name) {
    check(specx_params_set_verification(raw_, name.c_str()));
    return *this;
  }
  // whose prompts a generation in a context may reuse (nullptr: none, and nothing is kept)
  Params& cache_scope(const char* scope) {
    check(specx_params_set_cache_scope(raw_, scope));
    return *this;
  }
  const specx_params* get() const { return raw_; }

 private:
  struct Free { void operator()(specx_params* p) const { specx_params_destroy(p); } };
  specx_params* raw_ = nullptr;
  std::unique_ptr<specx_params, Free> holder_;
};

// Caches kept between the generations created in it (a conversation): specx_context.
class Context {
 public:
  explicit Context(const Model& model) {
    specx_context* raw = nullptr;
    check(specx_context_create(model.get(), &raw));
    context_.reset(raw);
  }
  specx_context* get() const { return context_.get(); }

 private:
  struct Free { void operator()(specx_context* p) const { specx_context_destroy(p); } };
  std::unique_ptr<specx_context, Free> context_;
};

class Generation {
 public:
  Generation(const Model& model, const std::vector<int64_t>& prompt, const Params& params = Params()) {
    specx_generation* raw = nullptr;
    check(specx_generation_create(model.get(), prompt.data(), prompt.size(), params.get(), &raw));
    generation_.reset(raw);
  }
  // In `context`, which it holds until destroyed (keeps the prefix of the prompt it holds).
  Generation(Context& context, const std::vector<int64_t>& prompt, const Params& params = Params()) {
    specx_generation* raw = nullptr;
    check(specx_generation_create_in(context.get(), prompt.data(), prompt.size(), params.get(), &raw));
    generation_.reset(raw);
  }
  // One step's committed tokens (empty once done).
  std::vector<int64_t> next() {
    int64_t buf[SPECX_MAX_STEP_TOKENS];
    size_t n = 0;
    int finished = 0;
    check(specx_generation_next(generation_.get(), buf, SPECX_MAX_STEP_TOKENS, &n, &finished));
    done_ = finished != 0;
    return std::vector<int64_t>(buf, buf + n);
  }
  // Every token until it stops.
  std::vector<int64_t> run() {
    std::vector<int64_t> all;
    while (!done_) {
      std::vector<int64_t> step = next();
      all.insert(all.end(), step.begin(), step.end());
    }
    return all;
  }
  bool done() const { return done_; }
  void cancel() { specx_generation_cancel(generation_.get()); }  // any thread
  specx_stats stats() const {
    specx_stats s{};
    check(specx_generation_stats(generation_.get(), &s));
    return s;
  }

 private:
  struct Free { void operator()(specx_generation* p) const { specx_generation_destroy(p); } };
  std::unique_ptr<specx_generation, Free> generation_;
  bool done_ = false;
};

}  // namespace specx
