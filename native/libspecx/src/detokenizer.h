// Token ids to UTF-8 text as they stream in, exactly as the artifact's tokenizer decodes them
// (the `tokenizers` library's decode, special tokens skipped), never splitting a character.
//
// Exact where the tokenizer's decoder is ByteLevel (GPT-2's byte-to-unicode alphabet: GPT-2,
// Llama 3, Qwen, SmolLM2): every token is a byte string, the text is the bytes of the ids in
// order, decoded as UTF-8 with each maximal invalid subsequence replaced by U+FFFD (Rust's
// from_utf8_lossy, which decode uses). Other decoders (SentencePiece's byte fallback, Strip)
// are refused rather than approximated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace specx {

// The bytes of every id, read once from tokenizer.json; shared by a model's detokenizers.
class TokenBytes {
 public:
  // Throws Failure: SPECX_ARTIFACT for a missing or malformed file, SPECX_UNSUPPORTED for a
  // decoder this library does not reproduce exactly.
  static TokenBytes read(const std::string& path);
  // An id's bytes; "" for special tokens and for ids past the tokenizer (padding rows).
  const std::string& bytes(int64_t id) const;

 private:
  std::vector<std::string> bytes_;
};

class Detokenizer {
 public:
  explicit Detokenizer(const TokenBytes& table) : table_(table) {}
  // The text the ids complete (bytes of an unfinished character wait for the next ids).
  const std::string& push(const int64_t* ids, size_t count);
  // The end of the stream: what is left (an unfinished character becomes U+FFFD).
  const std::string& finish();

 private:
  void drain(bool final);
  const TokenBytes& table_;
  std::string pending_;  // bytes not yet decided
  std::string text_;     // the last call's answer
};

}  // namespace specx
