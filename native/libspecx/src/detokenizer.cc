#include "detokenizer.h"

#include <fstream>
#include <map>
#include <sstream>

#include "failure.h"
#include "json.h"

namespace specx {
namespace {

const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// GPT-2's byte-to-unicode alphabet, inverted: the code point each byte is written as -> byte.
// Printable Latin-1 bytes stand for themselves; the other 68 take code points 256, 257, ...
std::map<uint32_t, uint8_t> byte_level_alphabet() {
  std::map<uint32_t, uint8_t> out;
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    out[printable ? b : next++] = uint8_t(b);
  }
  return out;
}

// The code points of a UTF-8 string (tokenizer.json holds valid UTF-8: Rust wrote it).
std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = uint8_t(s[i]);
    const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int j = 1; j < n && i + size_t(j) < s.size(); ++j) cp = (cp << 6) | (uint8_t(s[i + size_t(j)]) & 0x3F);
    out.push_back(cp);
    i += size_t(n);
  }
  return out;
}

// A ByteLevel token's bytes: each character through the alphabet, or, where any character is
// outside it (an added token written as plain text), the token's own UTF-8.
std::string token_bytes(const std::string& token, const std::map<uint32_t, uint8_t>& alphabet) {
  std::string out;
  for (uint32_t cp : code_points(token)) {
    auto it = alphabet.find(cp);
    if (it == alphabet.end()) return token;
    out.push_back(char(it->second));
  }
  return out;
}

bool byte_level(const json::Value* decoder) {
  if (decoder == nullptr || !decoder->is_object()) return false;
  const json::Value* type = decoder->find("type");
  if (type == nullptr || !type->is_string()) return false;
  if (type->string == "ByteLevel") return true;
  const json::Value* steps = decoder->find("decoders");
  if (type->string != "Sequence" || steps == nullptr || !steps->is_array() || steps->array.empty()) return false;
  for (const json::Value& step : steps->array)
    if (!byte_level(&step)) return false;
  return true;
}

std::string describe(const json::Value* decoder) {
  if (decoder == nullptr || decoder->is_null()) return "none";
  const json::Value* type = decoder->find("type");
  std::string out = type != nullptr && type->is_string() ? type->string : "?";
  if (const json::Value* steps = decoder->find("decoders"); steps != nullptr && steps->is_array()) {
    out += " of";
    for (const json::Value& step : steps->array) out += " " + describe(&step);
  }
  return out;
}

// The length of the UTF-8 character starting at s[i]: > 0 complete and valid; 0 valid so far
// but cut off by the end of s; < 0 invalid, -n covering its maximal valid prefix of n bytes.
int utf8_char(const std::string& s, size_t i) {
  const auto c = uint8_t(s[i]);
  if (c < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c >= 0xE0 && c <= 0xEF) { need = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
  else if (c >= 0xF0 && c <= 0xF4) { need = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
  else return -1;
  for (int j = 1; j <= need; ++j) {
    if (i + size_t(j) >= s.size()) return 0;
    const auto b = uint8_t(s[i + size_t(j)]);
    if (j == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -j;
  }
  return need + 1;
}

}  // namespace

TokenBytes TokenBytes::read(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw artifact_error("tokenizer file " + path + " is missing");
  std::stringstream buffer;
  buffer << file.rdbuf();
  json::Value root;
  try {
    root = json::parse(buffer.str());
  } catch (const std::runtime_error& e) {
    throw artifact_error(path + " is not valid JSON: " + e.what());
  }
  const json::Value* decoder = root.find("decoder");
  const json::Value* model = root.find("model");
  const json::Value* vocab = model != nullptr ? model->find("vocab") : nullptr;
  if (!byte_level(decoder) || vocab == nullptr || !vocab->is_object())
    throw Failure(SPECX_UNSUPPORTED,
                  "this artifact's tokenizer decodes with " + describe(decoder) +
                      ", which libspecx does not reproduce exactly (it decodes ByteLevel BPE "
                      "tokenizers: GPT-2, Llama 3, Qwen, SmolLM2); decode the ids with the "
                      "host's tokenizer (tokenizers' decode)");
  const std::map<uint32_t, uint8_t> alphabet = byte_level_alphabet();
  TokenBytes table;
  auto place = [&](double id, std::string bytes) {
    if (id < 0 || id > 1e8) throw artifact_error(path + " has a token id out of range");
    if (table.bytes_.size() <= size_t(id)) table.bytes_.resize(size_t(id) + 1);
    table.bytes_[size_t(id)] = std::move(bytes);
  };
  for (const auto& [token, id] : vocab->object) place(id.number, token_bytes(token, alphabet));
  if (const json::Value* added = root.find("added_tokens"); added != nullptr && added->is_array()) {
    for (const json::Value& t : added->array) {  // added tokens take precedence, as in decode
      const json::Value* id = t.find("id");
      const json::Value* content = t.find("content");
      const json::Value* special = t.find("special");
      if (id == nullptr || !id->is_int() || content == nullptr || !content->is_string())
        throw artifact_error(path + " has an added token without id or content");
      const bool skip = special != nullptr && special->boolean;
      place(id->number, skip ? std::string() : token_bytes(content->string, alphabet));
    }
  }
  return table;
}

const std::string& TokenBytes::bytes(int64_t id) const {
  static const std::string none;
  return id >= 0 && size_t(id) < bytes_.size() ? bytes_[size_t(id)] : none;
}

void Detokenizer::drain(bool final) {
  size_t i = 0;
  while (i < pending_.size()) {
    const int n = utf8_char(pending_, i);
    if (n > 0) {
      text_.append(pending_, i, size_t(n));
      i += size_t(n);
    } else if (n < 0) {
      text_ += kReplacement;
      i += size_t(-n);
    } else if (final) {  // an unfinished character at the very end: one replacement
      text_ += kReplacement;
      i = pending_.size();
    } else {
      break;  // wait for the rest of the character
    }
  }
  pending_.erase(0, i);
}

const std::string& Detokenizer::push(const int64_t* ids, size_t count) {
  text_.clear();
  for (size_t i = 0; i < count; ++i) pending_ += table_.bytes(ids[i]);
  drain(false);
  return text_;
}

const std::string& Detokenizer::finish() {
  text_.clear();
  drain(true);
  return text_;
}

}  // namespace specx
