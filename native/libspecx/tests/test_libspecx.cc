// libspecx's own tests, driven by tests/native/test_libspecx.py with an artifact it exports:
//   test_libspecx ARTIFACT errors     bad input through the C ABI: codes and messages, no crash
//   test_libspecx ARTIFACT wrapper    the C++ wrapper: options, drafters, stats, exceptions
//   test_libspecx ARTIFACT threads N  N generations on one model at once, each equal to its run
//                                     alone
//   test_libspecx ARTIFACT cancel     cancelled from another thread mid-generation: it stops
//   test_libspecx ARTIFACT contexts   a context keeps a conversation's prefix for its scope only;
//                                     one generation at a time
// Prints one "ok ..." line per check; exits 1 at the first failure, naming it.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "specx.hpp"

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  std::exit(1);
}

void expect(bool ok, const std::string& what) {
  if (!ok) fail(what);
  std::printf("ok %s\n", what.c_str());
}

// The status's code, checked against `want`, its message containing `needle`; freed.
void expect_status(specx_status* status, specx_code want, const char* needle, const std::string& what) {
  if (status == nullptr) fail(what + ": no error");
  specx_code code = specx_status_code(status);
  std::string message = specx_status_message(status);
  specx_status_destroy(status);
  if (code != want) fail(what + ": code " + std::to_string(code) + " (" + message + ")");
  if (message.find(needle) == std::string::npos) fail(what + ": message '" + message + "' lacks '" + needle + "'");
  std::printf("ok %s: %s\n", what.c_str(), message.c_str());
}

std::vector<int64_t> prompt_of(int seed, size_t n, int64_t vocab) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < n; ++i) ids.push_back(int64_t((seed * 7919 + i * 104729 + i * i * 31) % uint64_t(vocab)));
  return ids;
}

void errors(const std::string& artifact) {
  specx_model* model = nullptr;
  expect_status(specx_model_load("/nonexistent/specx", nullptr, &model), SPECX_ARTIFACT, "is not a folder",
                "a missing artifact");
  expect(model == nullptr, "a failed load leaves no handle");
  expect_status(specx_model_load(nullptr, nullptr, &model), SPECX_INVALID_ARGUMENT, "folder is NULL",
                "a null folder");
  expect_status(specx_model_load(artifact.c_str(), nullptr, nullptr), SPECX_INVALID_ARGUMENT, "out is NULL",
                "a null out pointer");
  specx_model_options* options = nullptr;
  expect(specx_model_options_create(&options) == nullptr, "options created");
  expect_status(specx_model_options_set_threads(options, -1), SPECX_INVALID_ARGUMENT, "threads", "threads -1");
  expect_status(specx_model_options_set_provider(options, "tpu"), SPECX_INVALID_ARGUMENT, "unknown provider",
                "an unknown provider");
  expect(specx_model_options_set_provider(options, "cuda") == nullptr, "provider cuda accepted as a name");
  expect_status(specx_model_options_set_device_id(options, -1), SPECX_INVALID_ARGUMENT, "device_id",
                "device id -1");
  // Loads on onnxruntime-gpu with a GPU; anywhere else refused, naming the provider (the
  // Python tests check the refusal exactly against the ONNX Runtime in use).
  if (specx_status* st = specx_model_load(artifact.c_str(), options, &model)) {
    expect(specx_status_code(st) == SPECX_PROVIDER &&
               std::strstr(specx_status_message(st), "'cuda'") != nullptr,
           "cuda refused by name where it cannot run");
    specx_status_destroy(st);
  } else {
    specx_model_destroy(model);
    model = nullptr;
  }
  specx_model_options_destroy(options);
  expect(specx_model_load(artifact.c_str(), nullptr, &model) == nullptr && model != nullptr, "the artifact loads");
  const int64_t vocab = specx_model_vocab_size(model);
  const int64_t max_length = specx_model_max_length(model);
  specx_params* params = nullptr;
  expect(specx_params_create(&params) == nullptr, "params created");
  expect_status(specx_params_set_k(params, 17), SPECX_INVALID_ARGUMENT, "K must be in 0..16", "K 17");
  expect_status(specx_params_set_k(params, -5), SPECX_INVALID_ARGUMENT, "K must be in", "K -5");
  expect_status(specx_params_set_max_new_tokens(params, 0), SPECX_INVALID_ARGUMENT, ">= 1", "max_new_tokens 0");
  expect_status(specx_params_set_sampling(params, -1.0, 0, 1.0, 0.0), SPECX_INVALID_ARGUMENT,
                "temperature", "a negative temperature");
  expect_status(specx_params_set_sampling(params, 0.5, 0, 0.0, 0.0), SPECX_INVALID_ARGUMENT, "top_p",
                "top_p 0");
  expect_status(specx_params_set_sampling(params, 0.5, -1, 1.0, 0.0), SPECX_INVALID_ARGUMENT, "top_k",
                "top_k -1");
  expect_status(specx_params_set_sampling(params, 0.5, 0, 1.0, 1.0), SPECX_INVALID_ARGUMENT, "min_p",
                "min_p 1");
  expect_status(specx_params_set_verification(params, "coin"), SPECX_INVALID_ARGUMENT, "verification",
                "an unknown verification");
  specx_generation* gen = nullptr;
  std::vector<int64_t> ids{1, 2, 3};
  std::vector<int64_t> outside{1, vocab, 3};
  expect_status(specx_generation_create(model, outside.data(), outside.size(), params, &gen),
                SPECX_INVALID_ARGUMENT, "token ids must lie in", "an id outside the vocabulary");
  std::vector<int64_t> negative{-1};
  expect_status(specx_generation_create(model, negative.data(), 1, params, &gen), SPECX_INVALID_ARGUMENT,
                "token ids must lie in", "a negative id");
  std::vector<int64_t> long_prompt(size_t(max_length) + 1, 1);
  expect_status(specx_generation_create(model, long_prompt.data(), long_prompt.size(), params, &gen),
                SPECX_INVALID_ARGUMENT, "maximum context", "a prompt longer than the cache");
  expect_status(specx_generation_create(model, ids.data(), 0, params, &gen), SPECX_INVALID_ARGUMENT,
                "no tokens", "an empty prompt");
  expect_status(specx_generation_create(nullptr, ids.data(), ids.size(), params, &gen), SPECX_INVALID_ARGUMENT,
                "model is NULL", "a null model");
  expect(specx_params_set_drafter(params, "no-such-drafter") == nullptr, "any drafter name is taken as asked");
  expect_status(specx_generation_create(model, ids.data(), ids.size(), params, &gen), SPECX_INVALID_ARGUMENT,
                "unknown drafter", "an unknown drafter");
  expect(specx_params_set_drafter(params, "none") == nullptr && specx_params_set_k(params, 3) == nullptr,
         "drafter none, K 3");
  expect_status(specx_generation_create(model, ids.data(), ids.size(), params, &gen), SPECX_INVALID_ARGUMENT,
                "needs a drafter", "K > 0 with no drafter");
  expect(specx_params_set_k(params, SPECX_K_AUTO) == nullptr, "drafter none, K auto");
  expect_status(specx_generation_create(model, ids.data(), ids.size(), params, &gen), SPECX_INVALID_ARGUMENT,
                "K auto needs a drafter", "K auto with no drafter");
  expect_status(specx_params_set_max_k(params, 0), SPECX_INVALID_ARGUMENT, "max K", "max K 0");
  expect(specx_params_set_drafter(params, "ngram") == nullptr, "drafter ngram");
  expect(specx_params_set_k(params, 2) == nullptr &&
             specx_generation_create(model, ids.data(), ids.size(), params, &gen) == nullptr,
         "a generation starts");
  int64_t small[4];
  size_t n = 0;
  int done = 0;
  expect_status(specx_generation_next(gen, small, 4, &n, &done), SPECX_INVALID_ARGUMENT,
                "SPECX_MAX_STEP_TOKENS", "a token buffer too small for a step");
  expect_status(specx_generation_next(nullptr, small, 4, &n, &done), SPECX_INVALID_ARGUMENT, "generation is NULL",
                "a null generation");
  expect_status(specx_generation_stats(gen, nullptr), SPECX_INVALID_ARGUMENT, "out is NULL", "stats into NULL");
  specx_generation_cancel(nullptr);
  specx_generation_destroy(nullptr);
  specx_model_destroy(nullptr);
  specx_params_destroy(nullptr);
  specx_status_destroy(nullptr);
  expect(specx_status_code(nullptr) == SPECX_OK && std::strlen(specx_status_message(nullptr)) == 0,
         "a null status reads as OK");
  expect(specx_model_drafter_name(model, 1000) == nullptr && specx_model_eos_id(model, 1000) == -1,
         "indexes past the end give nothing");
  specx_detokenizer* detok = nullptr;
  const char* text = nullptr;
  size_t length = 0;
  expect_status(specx_detokenizer_create(nullptr, &detok), SPECX_INVALID_ARGUMENT, "model is NULL",
                "a detokenizer of no model");
  expect(specx_detokenizer_create(model, &detok) == nullptr && detok != nullptr, "a detokenizer");
  const int64_t past_end[2] = {1, vocab};
  expect_status(specx_detokenizer_push(detok, past_end, 2, &text, &length), SPECX_INVALID_ARGUMENT,
                "outside the vocabulary", "an id past the vocabulary");
  expect_status(specx_detokenizer_push(detok, nullptr, 2, &text, &length), SPECX_INVALID_ARGUMENT,
                "ids is NULL", "null ids");
  expect_status(specx_detokenizer_push(nullptr, past_end, 1, &text, &length), SPECX_INVALID_ARGUMENT,
                "detokenizer is NULL", "a null detokenizer");
  expect(specx_detokenizer_push(detok, nullptr, 0, &text, &length) == nullptr && length == 0 &&
             specx_detokenizer_finish(detok, &text, nullptr) == nullptr && std::strlen(text) == 0,
         "no ids, no text");
  specx_detokenizer_destroy(detok);
  specx_detokenizer_destroy(nullptr);
  specx_generation_destroy(gen);
  specx_params_destroy(params);
  specx_model_destroy(model);
}

void wrapper(const std::string& artifact) {
  specx::Model model(artifact, specx::ModelOptions().threads(1));
  expect(model.vocab_size() > 0 && model.max_length() > 0, "the model's sizes");
  std::vector<std::string> names = model.drafters();
  expect(names.size() >= 2 && names.back() == "none", "drafters end with none");
  std::vector<int64_t> prompt = prompt_of(1, 9, model.vocab_size());
  specx::Params alone;
  alone.max_new_tokens(24).k(0);
  std::vector<int64_t> reference = specx::Generation(model, prompt, alone).run();
  expect(!reference.empty() && reference.size() <= 24, "the target alone generates");
  for (const std::string& name : names) {
    if (name == "none") continue;
    for (int k : {1, 4, SPECX_K_AUTO}) {
      specx::Params params;
      params.max_new_tokens(24).k(k).drafter(name);
      specx::Generation gen(model, prompt, params);
      std::vector<int64_t> got = gen.run();
      specx_stats s = gen.stats();
      const std::string k_name = k == SPECX_K_AUTO ? "auto" : std::to_string(k);
      expect(got == reference, "greedy with " + name + ", K " + k_name + " equals the target alone");
      expect(s.new_tokens == int64_t(got.size()) && s.target_passes <= s.new_tokens &&
                 s.accepted <= s.proposed && std::string(s.drafter) == name &&
                 (k == SPECX_K_AUTO ? s.adaptive == 1 && s.k == 8 : s.k == k),
             "its stats add up (" + std::to_string(s.accepted) + " of " + std::to_string(s.proposed) + " accepted)");
    }
  }
  specx::Detokenizer whole(model), stepwise(model);
  std::string at_once = whole.push(reference) + whole.finish(), streamed;
  for (int64_t id : reference) streamed += stepwise.push({id});
  streamed += stepwise.finish();
  expect(streamed == at_once, "text streamed id by id equals the text of all ids at once");
  try {
    specx::Params bad;
    bad.k(99);
    fail("K 99 threw nothing");
  } catch (const specx::Error& e) {
    expect(e.code() == SPECX_INVALID_ARGUMENT, std::string("the wrapper throws specx::Error: ") + e.what());
  }
  std::vector<int64_t> eos = model.eos_ids();
  specx::Params stop;
  stop.max_new_tokens(24).k(0).stop_ids({reference[2]});
  specx::Generation stopped(model, prompt, stop);
  std::vector<int64_t> head = stopped.run();
  size_t first = 0;
  while (reference[first] != reference[2]) ++first;
  expect(head == std::vector<int64_t>(reference.begin(), reference.begin() + long(first) + 1) &&
             std::string(stopped.stats().stop_reason) == "stop_id",
         "a stop id ends the generation after emitting it");
}

void threads(const std::string& artifact, int n) {
  specx::Model model(artifact, specx::ModelOptions().threads(1));
  std::vector<std::string> names = model.drafters();
  std::vector<std::vector<int64_t>> alone(static_cast<size_t>(n)), together(static_cast<size_t>(n));
  auto params_of = [&](int i) {
    specx::Params p;
    p.max_new_tokens(20).k(i % 3 == 0 ? 0 : 1 + i % 4).drafter(i % 3 == 0 ? "none" : names[size_t(i) % (names.size() - 1)]);
    return p;
  };
  for (int i = 0; i < n; ++i)
    alone[size_t(i)] = specx::Generation(model, prompt_of(i + 2, size_t(5 + i), model.vocab_size()), params_of(i)).run();
  std::vector<std::thread> pool;
  std::atomic<int> errors{0};
  for (int i = 0; i < n; ++i) {
    pool.emplace_back([&, i] {
      try {
        together[size_t(i)] =
            specx::Generation(model, prompt_of(i + 2, size_t(5 + i), model.vocab_size()), params_of(i)).run();
      } catch (const specx::Error&) {
        ++errors;
      }
    });
  }
  for (std::thread& t : pool) t.join();
  expect(errors == 0, "no generation failed on its thread");
  for (int i = 0; i < n; ++i)
    expect(together[size_t(i)] == alone[size_t(i)], "generation " + std::to_string(i) + " on its thread equals its run alone");
}

void cancel(const std::string& artifact) {
  specx::Model model(artifact, specx::ModelOptions().threads(1));
  specx::Params params;
  params.max_new_tokens(100000).k(0);
  specx::Generation gen(model, prompt_of(3, 4, model.vocab_size()), params);
  std::atomic<int64_t> steps{0};
  std::thread runner([&] {
    while (!gen.done()) {
      gen.next();
      ++steps;
    }
  });
  while (steps < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  gen.cancel();
  runner.join();
  specx_stats s = gen.stats();
  expect(std::string(s.stop_reason) == "cancelled" || std::string(s.stop_reason) == "max_length",
         std::string("a cancelled generation stops (") + s.stop_reason + ")");
  expect(s.new_tokens < model.max_length(), "it stopped before filling its cache: " + std::to_string(s.new_tokens));
  expect(gen.next().empty() && gen.done(), "a stopped generation runs no more steps");
}

void contexts(const std::string& artifact) {
  specx::Model model(artifact, specx::ModelOptions().threads(1));
  specx::Context chat(model);
  specx::Params params;
  params.max_new_tokens(12).k(0);
  std::vector<int64_t> prompt = prompt_of(4, 10, model.vocab_size());
  std::vector<int64_t> answer;
  {
    specx::Generation first(chat, prompt, params);
    answer = first.run();
    expect(first.stats().reused_prompt_tokens == 0, "a new context keeps nothing");
    specx_generation* second = nullptr;
    expect_status(specx_generation_create_in(chat.get(), prompt.data(), prompt.size(), params.get(), &second),
                  SPECX_INVALID_ARGUMENT, "another generation is running", "one generation at a time");
  }
  std::vector<int64_t> turn = prompt;
  turn.insert(turn.end(), answer.begin(), answer.end());
  for (int64_t extra : {5, 6, 7}) turn.push_back(extra % model.vocab_size());
  const std::vector<int64_t> cold = specx::Generation(model, turn, params).run();
  {
    specx::Generation again(chat, turn, params);
    expect(again.run() == cold, "the next turn gives a cold start's tokens");
    const int64_t kept = again.stats().reused_prompt_tokens;
    expect(kept == int64_t(prompt.size() + answer.size()) - 1,
           "the next turn keeps the prompt and the answer but its last token: " + std::to_string(kept));
  }
  specx::Params scoped;
  scoped.max_new_tokens(12).k(0).cache_scope("tenant-b");
  { specx::Generation b(chat, turn, scoped); b.run(); expect(b.stats().reused_prompt_tokens == 0, "another scope keeps nothing"); }
  scoped.cache_scope(nullptr);
  { specx::Generation none(chat, turn, scoped); none.run(); expect(none.stats().reused_prompt_tokens == 0, "no scope keeps nothing"); }
  { specx::Generation after(chat, turn, params); after.run(); expect(after.stats().reused_prompt_tokens == 0, "nor leaves anything"); }
  specx_context* raw = nullptr;
  expect_status(specx_context_create(nullptr, &raw), SPECX_INVALID_ARGUMENT, "model is NULL", "a context of no model");
  specx_generation* gen = nullptr;
  expect_status(specx_generation_create_in(nullptr, turn.data(), turn.size(), params.get(), &gen),
                SPECX_INVALID_ARGUMENT, "context is NULL", "a generation in no context");
  specx_context_destroy(nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ARTIFACT errors|wrapper|threads N|cancel|contexts\n", argv[0]);
    return 2;
  }
  std::string artifact = argv[1], what = argv[2];
  try {
    if (what == "errors") errors(artifact);
    else if (what == "wrapper") wrapper(artifact);
    else if (what == "threads") threads(artifact, argc > 3 ? std::atoi(argv[3]) : 4);
    else if (what == "cancel") cancel(artifact);
    else if (what == "contexts") contexts(artifact);
    else fail("unknown test " + what);
  } catch (const specx::Error& e) {
    fail(std::string("specx::Error: ") + e.what());
  }
  std::printf("PASS %s\n", what.c_str());
  return 0;
}
