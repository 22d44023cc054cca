// The C ABI (include/specx.h): handles around the C++ objects, every exception turned into a
// status at this boundary.
#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "context.h"
#include "failure.h"
#include "generation.h"
#include "model.h"
#include "specx.h"

#ifndef SPECX_VERSION
#define SPECX_VERSION "0.0.0"
#endif

struct specx_status {
  specx_code code;
  std::string message;
};

struct specx_model_options {
  specx::SessionConfig config;
  bool kernels_named = false;
};

struct specx_model {
  std::unique_ptr<specx::Model> model;
};

struct specx_detokenizer {
  int64_t vocab_size;
  specx::Detokenizer stream;
};

struct specx_params {
  specx::Settings settings;
};

struct specx_context {
  std::unique_ptr<specx::Context> context;
};

struct specx_generation {
  std::unique_ptr<specx::Generation> generation;
};

namespace {

// The status returned where not even a status can be allocated: static, never freed.
specx_status* out_of_memory() {
  static specx_status oom{SPECX_OUT_OF_MEMORY, "out of memory"};
  return &oom;
}

specx_status* make_status(specx_code code, const std::string& message) {
  try {
    return new specx_status{code, message};
  } catch (const std::bad_alloc&) {
    return out_of_memory();
  }
}

template <typename F>
specx_status* guarded(F&& body) {
  try {
    body();
    return nullptr;
  } catch (const specx::Failure& e) {
    return make_status(e.code(), e.what());
  } catch (const Ort::Exception& e) {
    return make_status(SPECX_RUNTIME, std::string("onnxruntime: ") + e.what());
  } catch (const std::bad_alloc&) {
    return make_status(SPECX_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return make_status(SPECX_RUNTIME, e.what());
  } catch (...) {
    return make_status(SPECX_RUNTIME, "an unknown error");
  }
}

specx_status* null_argument(const char* what) {
  return make_status(SPECX_INVALID_ARGUMENT, std::string(what) + " is NULL");
}

// libspecx_kernels.so beside this library, where one is there.
std::string kernels_beside_us() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&kernels_beside_us), &info) == 0 || info.dli_fname == nullptr)
    return "";
  std::string self = info.dli_fname;
  size_t slash = self.rfind('/');
  return (slash == std::string::npos ? std::string(".") : self.substr(0, slash)) +
         "/libspecx_kernels.so";
}

}  // namespace

extern "C" {

int specx_abi_version(void) { return SPECX_ABI_VERSION; }
const char* specx_version(void) { return SPECX_VERSION; }

specx_code specx_status_code(const specx_status* status) {
  return status == nullptr ? SPECX_OK : status->code;
}

const char* specx_status_message(const specx_status* status) {
  return status == nullptr ? "" : status->message.c_str();
}

void specx_status_destroy(specx_status* status) {
  if (status != out_of_memory()) delete status;
}

specx_status* specx_model_options_create(specx_model_options** out) {
  if (out == nullptr) return null_argument("out");
  return guarded([&] { *out = new specx_model_options(); });
}

void specx_model_options_destroy(specx_model_options* options) { delete options; }

specx_status* specx_model_options_set_threads(specx_model_options* options, int threads) {
  if (options == nullptr) return null_argument("options");
  if (threads < 0 || threads > 1024)
    return make_status(SPECX_INVALID_ARGUMENT, "threads must be in 0..1024 (0: ONNX Runtime's default), got " +
                                                   std::to_string(threads));
  options->config.threads = threads;
  return nullptr;
}

specx_status* specx_model_options_set_provider(specx_model_options* options, const char* provider) {
  if (options == nullptr) return null_argument("options");
  if (provider == nullptr) return null_argument("provider");
  std::string p = provider;
  if (p != "cpu" && p != "cuda" && p != "tensorrt")
    return make_status(SPECX_INVALID_ARGUMENT,
                       "unknown provider '" + p + "' (use \"cpu\", \"cuda\" or \"tensorrt\")");
  options->config.provider = p;
  return nullptr;
}

specx_status* specx_model_options_set_device_id(specx_model_options* options, int device_id) {
  if (options == nullptr) return null_argument("options");
  if (device_id < 0 || device_id > 1023)
    return make_status(SPECX_INVALID_ARGUMENT, "device_id must be in 0..1023, got " + std::to_string(device_id));
  options->config.device_id = device_id;
  return nullptr;
}

specx_status* specx_model_options_set_kernels_library(specx_model_options* options, const char* path) {
  if (options == nullptr) return null_argument("options");
  if (path == nullptr) return null_argument("path");
  options->config.kernels_library = path;
  options->kernels_named = true;
  return nullptr;
}

specx_status* specx_model_load(const char* folder, const specx_model_options* options,
                               specx_model** out) {
  if (out == nullptr) return null_argument("out");
  *out = nullptr;
  if (folder == nullptr) return null_argument("folder");
  return guarded([&] {
    specx::SessionConfig config = options != nullptr ? options->config : specx::SessionConfig{};
    if (options == nullptr || !options->kernels_named) {
      const char* env = std::getenv("SPECX_KERNELS_LIBRARY");
      config.kernels_library = env != nullptr && *env ? env : kernels_beside_us();
    }
    auto model = std::make_unique<specx::Model>(folder, config);
    *out = new specx_model{std::move(model)};
  });
}

void specx_model_destroy(specx_model* model) { delete model; }

int64_t specx_model_vocab_size(const specx_model* model) {
  return model == nullptr ? 0 : model->model->manifest().target.vocab_size;
}

int64_t specx_model_max_length(const specx_model* model) {
  return model == nullptr ? 0 : model->model->manifest().max_length;
}

size_t specx_model_eos_count(const specx_model* model) {
  return model == nullptr ? 0 : model->model->manifest().eos_token_ids.size();
}

int64_t specx_model_eos_id(const specx_model* model, size_t i) {
  if (model == nullptr || i >= model->model->manifest().eos_token_ids.size()) return -1;
  return model->model->manifest().eos_token_ids[i];
}

size_t specx_model_drafter_count(const specx_model* model) {
  return model == nullptr ? 0 : model->model->drafter_names().size();
}

const char* specx_model_drafter_name(const specx_model* model, size_t i) {
  if (model == nullptr || i >= model->model->drafter_names().size()) return nullptr;
  return model->model->drafter_names()[i].c_str();
}

const char* specx_model_default_drafter(const specx_model* model) {
  return model == nullptr ? nullptr : model->model->default_drafter().c_str();
}

specx_status* specx_detokenizer_create(const specx_model* model, specx_detokenizer** out) {
  if (out == nullptr) return null_argument("out");
  *out = nullptr;
  if (model == nullptr) return null_argument("model");
  return guarded([&] {
    *out = new specx_detokenizer{model->model->manifest().target.vocab_size,
                                 specx::Detokenizer(model->model->token_bytes())};
  });
}

void specx_detokenizer_destroy(specx_detokenizer* detokenizer) { delete detokenizer; }

specx_status* specx_detokenizer_push(specx_detokenizer* detokenizer, const int64_t* ids, size_t count,
                                     const char** text, size_t* length) {
  if (detokenizer == nullptr) return null_argument("detokenizer");
  if (ids == nullptr && count > 0) return null_argument("ids");
  if (text == nullptr) return null_argument("text");
  for (size_t i = 0; i < count; ++i)
    if (ids[i] < 0 || ids[i] >= detokenizer->vocab_size)
      return make_status(SPECX_INVALID_ARGUMENT, "id " + std::to_string(ids[i]) + " is outside the vocabulary (0.." +
                                                     std::to_string(detokenizer->vocab_size - 1) + ")");
  return guarded([&] {
    const std::string& out = detokenizer->stream.push(ids, count);
    *text = out.c_str();
    if (length != nullptr) *length = out.size();
  });
}

specx_status* specx_detokenizer_finish(specx_detokenizer* detokenizer, const char** text, size_t* length) {
  if (detokenizer == nullptr) return null_argument("detokenizer");
  if (text == nullptr) return null_argument("text");
  return guarded([&] {
    const std::string& out = detokenizer->stream.finish();
    *text = out.c_str();
    if (length != nullptr) *length = out.size();
  });
}

specx_status* specx_params_create(specx_params** out) {
  if (out == nullptr) return null_argument("out");
  return guarded([&] { *out = new specx_params(); });
}

void specx_params_destroy(specx_params* params) { delete params; }

specx_status* specx_params_set_max_new_tokens(specx_params* params, int64_t n) {
  if (params == nullptr) return null_argument("params");
  if (n < 1) return make_status(SPECX_INVALID_ARGUMENT, "max_new_tokens must be >= 1, got " + std::to_string(n));
  params->settings.max_new_tokens = n;
  return nullptr;
}

specx_status* specx_params_set_k(specx_params* params, int k) {
  if (params == nullptr) return null_argument("params");
  if (k != SPECX_K_DEFAULT && k != SPECX_K_AUTO && (k < 0 || k > SPECX_MAX_K))
    return make_status(SPECX_INVALID_ARGUMENT, "K must be in 0.." + std::to_string(SPECX_MAX_K) +
                                                   ", SPECX_K_DEFAULT or SPECX_K_AUTO, got " +
                                                   std::to_string(k));
  params->settings.k = k;
  return nullptr;
}

specx_status* specx_params_set_max_k(specx_params* params, int max_k) {
  if (params == nullptr) return null_argument("params");
  if (max_k < 1 || max_k > SPECX_MAX_K)
    return make_status(SPECX_INVALID_ARGUMENT, "max K must be in 1.." + std::to_string(SPECX_MAX_K) +
                                                   ", got " + std::to_string(max_k));
  params->settings.max_k = max_k;
  return nullptr;
}

specx_status* specx_params_set_drafter(specx_params* params, const char* name) {
  if (params == nullptr) return null_argument("params");
  params->settings.drafter = name == nullptr ? "" : name;
  return nullptr;
}

specx_status* specx_params_set_stop_ids(specx_params* params, const int64_t* ids, size_t n) {
  if (params == nullptr) return null_argument("params");
  if (ids == nullptr && n > 0) return null_argument("ids");
  return guarded([&] { params->settings.stop_ids.assign(ids, ids + n); });
}

specx_status* specx_params_set_sampling(specx_params* params, double temperature, int top_k,
                                        double top_p, double min_p) {
  if (params == nullptr) return null_argument("params");
  if (!(temperature >= 0.0) || std::isinf(temperature))
    return make_status(SPECX_INVALID_ARGUMENT, "temperature must be a finite number >= 0 (0: greedy)");
  if (top_k < 0) return make_status(SPECX_INVALID_ARGUMENT, "top_k must be >= 0 (0: off)");
  if (!(top_p > 0.0 && top_p <= 1.0)) return make_status(SPECX_INVALID_ARGUMENT, "top_p must be in (0, 1] (1: off)");
  if (!(min_p >= 0.0 && min_p < 1.0)) return make_status(SPECX_INVALID_ARGUMENT, "min_p must be in [0, 1) (0: off)");
  specx::Sampling& s = params->settings.sampling;
  s.temperature = temperature;
  s.top_k = top_k;
  s.top_p = top_p;
  s.min_p = min_p;
  return nullptr;
}

specx_status* specx_params_set_seed(specx_params* params, uint64_t seed) {
  if (params == nullptr) return null_argument("params");
  params->settings.seed = seed;
  params->settings.has_seed = true;
  return nullptr;
}

specx_status* specx_params_set_verification(specx_params* params, const char* name) {
  if (params == nullptr) return null_argument("params");
  if (name == nullptr) return null_argument("name");
  const std::string v = name;
  if (v != "invariant" && v != "rejection")
    return make_status(SPECX_INVALID_ARGUMENT, "verification must be \"invariant\" or \"rejection\", got '" + v + "'");
  params->settings.sampling.invariant = v == "invariant";
  return nullptr;
}

specx_status* specx_params_set_cache_scope(specx_params* params, const char* scope) {
  if (params == nullptr) return null_argument("params");
  return guarded([&] {
    params->settings.scope = scope == nullptr ? std::nullopt : std::optional<std::string>(scope);
  });
}

specx_status* specx_context_create(const specx_model* model, specx_context** out) {
  if (out == nullptr) return null_argument("out");
  *out = nullptr;
  if (model == nullptr) return null_argument("model");
  return guarded([&] {
    auto context = std::make_unique<specx::Context>(*model->model);
    *out = new specx_context{std::move(context)};
  });
}

void specx_context_destroy(specx_context* context) { delete context; }

double specx_counter_uniform(uint64_t seed, uint64_t stream, uint64_t position, uint64_t index) {
  return specx::counter_uniform(specx::counter_key(seed, stream, position), index);
}

specx_status* specx_generation_create(const specx_model* model, const int64_t* prompt,
                                      size_t prompt_len, const specx_params* params,
                                      specx_generation** out) {
  if (out == nullptr) return null_argument("out");
  *out = nullptr;
  if (model == nullptr) return null_argument("model");
  return guarded([&] {
    specx::Settings settings = params != nullptr ? params->settings : specx::Settings{};
    auto generation =
        std::make_unique<specx::Generation>(*model->model, nullptr, prompt, prompt_len, settings);
    *out = new specx_generation{std::move(generation)};
  });
}

specx_status* specx_generation_create_in(specx_context* context, const int64_t* prompt,
                                         size_t prompt_len, const specx_params* params,
                                         specx_generation** out) {
  if (out == nullptr) return null_argument("out");
  *out = nullptr;
  if (context == nullptr) return null_argument("context");
  return guarded([&] {
    specx::Settings settings = params != nullptr ? params->settings : specx::Settings{};
    specx::Context& where = *context->context;
    auto generation =
        std::make_unique<specx::Generation>(where.model(), &where, prompt, prompt_len, settings);
    *out = new specx_generation{std::move(generation)};
  });
}

void specx_generation_destroy(specx_generation* generation) { delete generation; }

specx_status* specx_generation_next(specx_generation* generation, int64_t* tokens, size_t capacity,
                                    size_t* n_tokens, int* done) {
  if (generation == nullptr) return null_argument("generation");
  if (tokens == nullptr) return null_argument("tokens");
  if (n_tokens == nullptr) return null_argument("n_tokens");
  if (done == nullptr) return null_argument("done");
  *n_tokens = 0;
  if (capacity < SPECX_MAX_STEP_TOKENS)
    return make_status(SPECX_INVALID_ARGUMENT, "tokens must hold SPECX_MAX_STEP_TOKENS (" +
                                                   std::to_string(SPECX_MAX_STEP_TOKENS) + ") ids, got room for " +
                                                   std::to_string(capacity));
  return guarded([&] {
    std::vector<int64_t> step = generation->generation->next();
    std::copy(step.begin(), step.end(), tokens);
    *n_tokens = step.size();
    *done = generation->generation->done() ? 1 : 0;
  });
}

void specx_generation_cancel(specx_generation* generation) {
  if (generation != nullptr) generation->generation->cancel();
}

specx_status* specx_generation_stats(const specx_generation* generation, specx_stats* out) {
  if (generation == nullptr) return null_argument("generation");
  if (out == nullptr) return null_argument("out");
  *out = generation->generation->stats();
  return nullptr;
}

}  // extern "C"
