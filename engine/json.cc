#include "engine/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "engine/error.h"

namespace remat {

Json Json::boolean(bool b) {
  Json j;
  j.type_ = Type::boolean;
  j.bool_ = b;
  return j;
}
Json Json::number(double d) {
  Json j;
  j.type_ = Type::number;
  j.number_ = d;
  return j;
}
Json Json::string(std::string s) {
  Json j;
  j.type_ = Type::string;
  j.string_ = std::move(s);
  return j;
}
Json Json::array(std::vector<Json> items) {
  Json j;
  j.type_ = Type::array;
  j.items_ = std::move(items);
  return j;
}
Json Json::object() {
  Json j;
  j.type_ = Type::object;
  return j;
}

namespace {
const char* type_name(Json::Type t) {
  switch (t) {
    case Json::Type::null: return "null";
    case Json::Type::boolean: return "boolean";
    case Json::Type::number: return "number";
    case Json::Type::string: return "string";
    case Json::Type::array: return "array";
    case Json::Type::object: return "object";
  }
  return "?";
}

class Parser {
 public:
  Parser(const std::string& text, const std::string& what) : s_(text), what_(what) {}

  Json parse_document() {
    Json v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) {
    throw IOError(what_ + ": malformed JSON at offset " + std::to_string(pos_) + ": " + msg);
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t'))
      ++pos_;
  }
  bool consume(char c) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) fail(std::string("expected '") + c + "'");
  }
  bool literal(const char* word) {
    const std::string w(word);
    if (s_.compare(pos_, w.size(), w) == 0) {
      pos_ += w.size();
      return true;
    }
    return false;
  }

  Json value(int depth) {
    if (depth > 64) fail("nested too deeply");
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end");
    const char c = s_[pos_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Json::string(str());
    if (literal("true")) return Json::boolean(true);
    if (literal("false")) return Json::boolean(false);
    if (literal("null")) return Json();
    return Json::number(num());
  }

  Json object(int depth) {
    expect('{');
    Json o = Json::object();
    if (consume('}')) return o;
    do {
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string key");
      std::string key = str();
      if (o.has(key)) fail("duplicate key \"" + key + "\"");
      expect(':');
      o.set(key, value(depth + 1));
    } while (consume(','));
    expect('}');
    return o;
  }

  Json array(int depth) {
    expect('[');
    Json a = Json::array();
    if (consume(']')) return a;
    do {
      a.push(value(depth + 1));
    } while (consume(','));
    expect(']');
    return a;
  }

  std::string str() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      c = s_[pos_++];
      switch (c) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (pos_ + 4 > s_.size()) fail("short \\u escape");
          const unsigned cp = unsigned(std::strtoul(s_.substr(pos_, 4).c_str(), nullptr, 16));
          pos_ += 4;
          // Encode as UTF-8 (surrogate pairs are not needed for our files).
          if (cp < 0x80) {
            out += char(cp);
          } else if (cp < 0x800) {
            out += char(0xc0 | (cp >> 6));
            out += char(0x80 | (cp & 0x3f));
          } else {
            out += char(0xe0 | (cp >> 12));
            out += char(0x80 | ((cp >> 6) & 0x3f));
            out += char(0x80 | (cp & 0x3f));
          }
          break;
        }
        default: fail(std::string("bad escape \\") + c);
      }
    }
    return out;
  }

  double num() {
    const std::size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.' ||
                                s_[pos_] == 'e' || s_[pos_] == 'E' || s_[pos_] == '+' || s_[pos_] == '-'))
      ++pos_;
    if (pos_ == start) fail("unexpected character '" + std::string(1, s_[start]) + "'");
    const std::string tok = s_.substr(start, pos_ - start);
    char* end = nullptr;
    const double v = std::strtod(tok.c_str(), &end);
    if (!end || *end != '\0') fail("bad number '" + tok + "'");
    return v;
  }

  const std::string& s_;
  std::string what_;
  std::size_t pos_ = 0;
};
}  // namespace

Json Json::parse(const std::string& text, const std::string& what) {
  return Parser(text, what).parse_document();
}

#define REMAT_JSON_TYPE(want)                                                                  \
  REMAT_CHECK(type_ == Type::want, IOError, "JSON: expected a " #want ", got a ", type_name(type_))

bool Json::as_bool() const {
  REMAT_JSON_TYPE(boolean);
  return bool_;
}
double Json::as_number() const {
  REMAT_JSON_TYPE(number);
  return number_;
}
std::int64_t Json::as_int() const {
  REMAT_JSON_TYPE(number);
  REMAT_CHECK(std::floor(number_) == number_ && std::abs(number_) < 9.007199254740992e15, IOError,
              "JSON: expected an integer, got ", number_);
  return std::int64_t(number_);
}
const std::string& Json::as_string() const {
  REMAT_JSON_TYPE(string);
  return string_;
}
const std::vector<Json>& Json::items() const {
  REMAT_JSON_TYPE(array);
  return items_;
}
const std::map<std::string, Json>& Json::members() const {
  REMAT_JSON_TYPE(object);
  return members_;
}
bool Json::has(const std::string& key) const { return type_ == Type::object && members_.count(key); }
const Json& Json::at(const std::string& key) const {
  REMAT_JSON_TYPE(object);
  auto it = members_.find(key);
  REMAT_CHECK(it != members_.end(), IOError, "JSON: missing key \"", key, "\"");
  return it->second;
}
Json& Json::set(const std::string& key, Json value) {
  REMAT_JSON_TYPE(object);
  members_[key] = std::move(value);
  return *this;
}
Json& Json::push(Json value) {
  REMAT_JSON_TYPE(array);
  items_.push_back(std::move(value));
  return *this;
}

namespace {
void quote_into(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void dump_into(std::string& out, const Json& j) {
  switch (j.type()) {
    case Json::Type::null: out += "null"; break;
    case Json::Type::boolean: out += j.as_bool() ? "true" : "false"; break;
    case Json::Type::number: out += Json::format_number(j.as_number()); break;
    case Json::Type::string: quote_into(out, j.as_string()); break;
    case Json::Type::array: {
      out += '[';
      bool first = true;
      for (const auto& it : j.items()) {
        if (!first) out += ',';
        first = false;
        dump_into(out, it);
      }
      out += ']';
      break;
    }
    case Json::Type::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, v] : j.members()) {
        if (!first) out += ',';
        first = false;
        quote_into(out, k);
        out += ':';
        dump_into(out, v);
      }
      out += '}';
      break;
    }
  }
}
}  // namespace

std::string Json::quote(const std::string& s) {
  std::string out;
  quote_into(out, s);
  return out;
}

std::string Json::format_number(double v, int digits) {
  char buf[48];
  if (!std::isfinite(v))
    std::snprintf(buf, sizeof buf, "null");
  else if (v == std::floor(v) && std::abs(v) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string Json::dump() const {
  std::string out;
  dump_into(out, *this);
  return out;
}

}  // namespace remat
