// A small JSON reader for manifest.json and the example worker's requests: values, objects,
// arrays, strings (\u escapes to UTF-8, surrogate pairs joined), numbers, true/false/null.
// Parse errors name the byte offset; nothing here allocates outside the returned tree.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace specx::json {

struct Value {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0.0;
  bool integral = false;  // written without fraction or exponent
  std::string string;
  std::vector<Value> array;
  std::map<std::string, Value> object;

  bool is_null() const { return kind == Kind::Null; }
  bool is_object() const { return kind == Kind::Object; }
  bool is_array() const { return kind == Kind::Array; }
  bool is_string() const { return kind == Kind::String; }
  bool is_int() const { return kind == Kind::Number && integral; }
  // the member `key` of an object, or nullptr (absent, or this is not an object)
  const Value* find(const std::string& key) const;
};

// Parse `text` as one JSON value. Throws std::runtime_error naming the offset on bad input.
Value parse(const std::string& text);

// `s` as a JSON string literal (quotes and escapes).
std::string quote(const std::string& s);

}  // namespace specx::json
