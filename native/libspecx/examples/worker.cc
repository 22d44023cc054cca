// A line-delimited JSON worker over libspecx: the smallest real service. It loads one artifact
// and answers one request per input line, one JSON object per output line, so any language
// that can start a process and read lines can use specx without Python:
//
//   specx_worker ARTIFACT [THREADS]
//   > {"id": 1, "prompt": [1, 2, 3], "max_new_tokens": 32, "k": 4, "drafter": "draft",
//      "stream": true, "text": true}
//   < {"id": 1, "delta": [17, 42], "text": "Hel"}           (stream: one line per step)
//   < {"id": 1, "tokens": [17, 42, ...], "text": "Hello", "stats": {...}}
//   < {"id": 1, "error": {"code": 1, "message": "..."}}     (a bad request; the worker goes on)
//
// The caller encodes prompts with the artifact's tokenizer.json (tokenizers has bindings for
// most languages); "text": true adds the decoded text, streamed by libspecx's detokenizer.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "json.h"
#include "specx.hpp"

namespace {

std::string ids_json(const std::vector<int64_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}

std::string stats_json(const specx_stats& s) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"prompt_tokens\":%lld,\"new_tokens\":%lld,\"target_passes\":%lld,"
                "\"draft_passes\":%lld,\"proposed\":%lld,\"accepted\":%lld,\"k\":%d,"
                "\"decode_tokens_per_s\":%.3f,\"tokens_per_s\":%.3f,",
                (long long)s.prompt_tokens, (long long)s.new_tokens, (long long)s.target_passes,
                (long long)s.draft_passes, (long long)s.proposed, (long long)s.accepted, s.k,
                s.decode_tokens_per_s, s.tokens_per_s);
  return std::string(buf) + "\"drafter\":" + specx::json::quote(s.drafter) +
         ",\"stop_reason\":" + specx::json::quote(s.stop_reason) + "}";
}

std::string error_json(const std::string& id, int code, const std::string& message) {
  return "{\"id\":" + id + ",\"error\":{\"code\":" + std::to_string(code) +
         ",\"message\":" + specx::json::quote(message) + "}}";
}

int64_t integer(const specx::json::Value& request, const char* key, int64_t fallback) {
  const specx::json::Value* v = request.find(key);
  if (v == nullptr || v->is_null()) return fallback;
  if (!v->is_int()) throw specx::Error(SPECX_INVALID_ARGUMENT, std::string(key) + " must be an integer");
  return int64_t(v->number);
}

void answer(const specx::Model& model, const std::string& line) {
  std::string id = "null";
  try {
    specx::json::Value request = specx::json::parse(line);
    if (!request.is_object()) throw specx::Error(SPECX_INVALID_ARGUMENT, "a request is a JSON object");
    if (const specx::json::Value* v = request.find("id"); v != nullptr && (v->is_int() || v->is_string()))
      id = v->is_int() ? std::to_string(int64_t(v->number)) : specx::json::quote(v->string);
    const specx::json::Value* prompt = request.find("prompt");
    if (prompt == nullptr || !prompt->is_array())
      throw specx::Error(SPECX_INVALID_ARGUMENT, "\"prompt\" must be a list of token ids");
    std::vector<int64_t> ids;
    for (const specx::json::Value& t : prompt->array) {
      if (!t.is_int()) throw specx::Error(SPECX_INVALID_ARGUMENT, "\"prompt\" holds a non-integer");
      ids.push_back(int64_t(t.number));
    }
    specx::Params params;
    params.max_new_tokens(integer(request, "max_new_tokens", 128));
    params.k(int(integer(request, "k", SPECX_K_DEFAULT)));
    if (const specx::json::Value* d = request.find("drafter"); d != nullptr && d->is_string())
      params.drafter(d->string);
    const specx::json::Value* stream = request.find("stream");
    const bool streaming = stream != nullptr && stream->boolean;
    const specx::json::Value* with_text = request.find("text");
    std::unique_ptr<specx::Detokenizer> detokenizer;
    if (with_text != nullptr && with_text->boolean) detokenizer = std::make_unique<specx::Detokenizer>(model);
    specx::Generation generation(model, ids, params);
    std::vector<int64_t> all;
    std::string text;
    while (!generation.done()) {
      std::vector<int64_t> step = generation.next();
      all.insert(all.end(), step.begin(), step.end());
      std::string piece = detokenizer ? detokenizer->push(step) : "";
      if (generation.done() && detokenizer) piece += detokenizer->finish();
      text += piece;
      if (streaming && !step.empty())
        std::cout << "{\"id\":" << id << ",\"delta\":" << ids_json(step)
                  << (detokenizer ? ",\"text\":" + specx::json::quote(piece) : "") << "}" << std::endl;
    }
    std::cout << "{\"id\":" << id << ",\"tokens\":" << ids_json(all)
              << (detokenizer ? ",\"text\":" + specx::json::quote(text) : "")
              << ",\"stats\":" << stats_json(generation.stats()) << "}" << std::endl;
  } catch (const specx::Error& e) {
    std::cout << error_json(id, e.code(), e.what()) << std::endl;
  } catch (const std::runtime_error& e) {  // the request is no JSON
    std::cout << error_json(id, SPECX_INVALID_ARGUMENT, std::string("bad request: ") + e.what()) << std::endl;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s ARTIFACT [THREADS]\n", argv[0]);
    return 2;
  }
  try {
    specx::ModelOptions options;
    if (argc == 3) options.threads(std::stoi(argv[2]));
    specx::Model model(argv[1], options);
    std::cout << "{\"ready\":true,\"vocab_size\":" << model.vocab_size()
              << ",\"max_length\":" << model.max_length() << "}" << std::endl;
    std::string line;
    while (std::getline(std::cin, line)) {
      if (!line.empty()) answer(model, line);
    }
  } catch (const specx::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
