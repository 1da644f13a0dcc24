// A minimal JSON value with a strict parser and a writer: enough for config
// files, safetensors headers and the tools' machine-readable output.
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

  // Parses `text`; throws IOError naming `what` and the offset on malformed input.
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
  std::int64_t as_int() const;  // also checks the number is integral
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

  // Compact serialisation (keys in sorted order).
  std::string dump() const;

  // `s` as a JSON string literal (quotes and escapes).
  static std::string quote(const std::string& s);
  // `v` as a JSON number: integers exactly, others with `digits` significant
  // digits; non-finite values become null.
  static std::string format_number(double v, int digits = 17);

 private:
  Type type_ = Type::null;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<Json> items_;
  std::map<std::string, Json> members_;
};

}  // namespace remat
