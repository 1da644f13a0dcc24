// A minimal JSON value with a strict parser (nlohmann-json underneath) and a
// writer: enough for config files, safetensors headers and the tools'
// machine-readable output. Numbers are stored as doubles.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace remat {

class Json {
 public:
  enum class Type { null, boolean, number, string, array, object };

  Json() = default;  // null
  static Json boolean(bool b);
  static Json number(double d);
  static Json string(std::string s);
  static Json array(std::vector<Json> items = {});
  static Json object();

  // Parses `text` as one RFC 8259 JSON value; throws IOError naming `what`, the
  // byte offset and the line/column on malformed input. Strict: duplicate keys,
  // more than 64 nested arrays/objects, trailing characters, a byte-order mark,
  // invalid UTF-8, lone surrogate escapes and numbers that overflow a double
  // are errors.
  static Json parse(const std::string& text, const std::string& what = "JSON");

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::null; }
  bool is_number() const { return type_ == Type::number; }
  bool is_string() const { return type_ == Type::string; }
  bool is_array() const { return type_ == Type::array; }
  bool is_object() const { return type_ == Type::object; }

  // Typed access; throws IOError naming the expected type when it differs.
  bool as_bool() const;
  double as_number() const;
  // The number as an integer: throws IOError unless it is integral, below 2^53
  // in magnitude (so it is exact), and (when parsed) its text is exactly an
  // integer ("1.0" and "1e2" are, "1.0000000000000000001" is not).
  std::int64_t as_int() const;
  const std::string& as_string() const;
  const std::vector<Json>& items() const;
  // Object members in key order.
  const std::map<std::string, Json>& members() const;

  bool has(const std::string& key) const;
  // Member `key` of an object; throws IOError if missing.
  const Json& at(const std::string& key) const;
  // Sets member `key` of an object.
  Json& set(const std::string& key, Json value);
  // Appends to an array.
  Json& push(Json value);

  // Compact serialisation: keys in sorted order, numbers by format_number,
  // strings byte for byte when they are valid UTF-8; in others every invalid
  // byte sequence becomes U+FFFD, so the output always parses back.
  std::string dump() const;

  // `s` as a JSON string literal (quotes and escapes).
  static std::string quote(const std::string& s);
  // `v` as a JSON number: integers exactly, others with `digits` significant
  // digits; non-finite values become null.
  static std::string format_number(double v, int digits = 17);

 private:
  friend class JsonSaxBuilder;  // engine/json.cc: builds values while parsing

  Type type_ = Type::null;
  bool bool_ = false;
  double number_ = 0;
  // Set for a parsed number whose text is not exactly an integer, so as_int
  // rejects it even where number_ rounded to an integral value.
  bool inexact_integer_ = false;
  std::string string_;
  std::vector<Json> items_;
  std::map<std::string, Json> members_;
};

}  // namespace remat
