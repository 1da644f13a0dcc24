#include "engine/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string_view>

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

// Deepest nesting of arrays and objects Json::parse accepts.
constexpr std::size_t kMaxDepth = 64;

// Hands nlohmann's lexer the text one byte at a time and records how many
// bytes it has taken, so that errors raised by the builder (duplicate keys,
// depth) can name an offset too. The lexer reads strictly forward.
class CountingIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  CountingIterator(const char* base, std::size_t pos, std::size_t* consumed)
      : base_(base), pos_(pos), consumed_(consumed) {}
  reference operator*() const { return base_[pos_]; }
  CountingIterator& operator++() {
    *consumed_ = ++pos_;
    return *this;
  }
  CountingIterator operator++(int) {
    CountingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const CountingIterator& o) const { return pos_ == o.pos_; }

 private:
  const char* base_;
  std::size_t pos_;
  std::size_t* consumed_;
};

// Whether the number token `tok` (RFC 8259 syntax, checked by the lexer)
// denotes an integer exactly: its decimal digits times a power of ten.
bool integral_text(std::string_view tok) {
  std::size_t i = tok.starts_with('-') ? 1 : 0;
  std::int64_t frac_digits = 0, trailing_zeros = 0;
  bool nonzero = false;
  auto digit = [&](char c, bool in_fraction) {
    if (in_fraction) ++frac_digits;
    if (c == '0') {
      ++trailing_zeros;
    } else {
      nonzero = true;
      trailing_zeros = 0;
    }
  };
  for (; i < tok.size() && tok[i] >= '0' && tok[i] <= '9'; ++i) digit(tok[i], false);
  // The decimal point: nlohmann hands over the token with the C locale's
  // decimal point, '.' unless a program changed LC_NUMERIC.
  if (i < tok.size() && tok[i] != 'e' && tok[i] != 'E')
    for (++i; i < tok.size() && tok[i] >= '0' && tok[i] <= '9'; ++i) digit(tok[i], true);
  std::int64_t exponent = 0;
  if (i < tok.size() && (tok[i] == 'e' || tok[i] == 'E')) {
    ++i;
    const bool negative = i < tok.size() && tok[i] == '-';
    if (i < tok.size() && (tok[i] == '-' || tok[i] == '+')) ++i;
    for (; i < tok.size(); ++i) exponent = std::min<std::int64_t>(exponent * 10 + (tok[i] - '0'), 1'000'000'000'000);
    if (negative) exponent = -exponent;
  }
  // The value is (digits without their trailing zeros) * 10^(exponent - frac_digits + trailing_zeros).
  return !nonzero || exponent - frac_digits + trailing_zeros >= 0;
}

// nlohmann's message without its "[json.exception.parse_error.101] parse
// error at line 1, column 4: " prefix (Json::parse adds its own position).
std::string library_message(const char* what) {
  std::string_view m(what);
  if (m.starts_with("[json.exception.")) {
    const auto p = m.find("] ");
    if (p != std::string_view::npos) m.remove_prefix(p + 2);
  }
  if (m.starts_with("parse error")) {
    const auto p = m.find(": ");
    if (p != std::string_view::npos) m.remove_prefix(p + 2);
  }
  return std::string(m);
}

// Shortest text that reads back as `v`, for messages.
std::string shortest(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace

// Builds a Json from nlohmann's SAX events and enforces what the library does
// not: unique keys and the depth limit. The first error stops the parse.
class JsonSaxBuilder final : public nlohmann::json_sax<nlohmann::json> {
 public:
  JsonSaxBuilder(const std::string& text, const std::size_t& consumed) : text_(text), consumed_(consumed) {}

  bool null() override { return add(Json()); }
  bool boolean(bool b) override { return add(Json::boolean(b)); }
  // The lexer reports tokens with a minus sign here, so 0 is "-0".
  bool number_integer(number_integer_t v) override { return add(Json::number(v == 0 ? -0.0 : double(v))); }
  bool number_unsigned(number_unsigned_t v) override { return add(Json::number(double(v))); }
  bool number_float(number_float_t v, const string_t& token) override {
    Json j = Json::number(v);
    j.inexact_integer_ = !integral_text(token);
    return add(std::move(j));
  }
  bool string(string_t& s) override { return add(Json::string(std::move(s))); }
  bool binary(binary_t&) override { return fail(here(), "binary values are not JSON"); }

  bool start_object(std::size_t) override { return open(Json::object()); }
  bool key(string_t& k) override {
    Frame& top = stack_.back();
    if (top.value.has(k)) return fail(key_start(), "duplicate key " + Json::quote(k));
    top.key = std::move(k);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_array() override { return close(); }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    // `position` counts the bytes the lexer read, the offending one last.
    return fail(position ? position - 1 : 0, library_message(e.what()));
  }

  Json take() { return std::move(root_); }
  std::size_t error_offset() const { return error_offset_; }
  const std::string& error() const { return error_; }

 private:
  struct Frame {
    Json value;       // the array or object being filled
    std::string key;  // an object's key awaiting its value
  };

  bool add(Json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
    } else {
      Frame& top = stack_.back();
      if (top.value.is_array())
        top.value.items_.push_back(std::move(v));
      else
        top.value.members_.emplace(std::move(top.key), std::move(v));
    }
    return true;
  }
  bool open(Json container) {
    if (stack_.size() >= kMaxDepth)
      return fail(here(), "nested deeper than " + std::to_string(kMaxDepth) + " arrays/objects");
    stack_.push_back({std::move(container), {}});
    return true;
  }
  bool close() {
    Json v = std::move(stack_.back().value);
    stack_.pop_back();
    return add(std::move(v));
  }
  bool fail(std::size_t offset, std::string message) {
    error_offset_ = std::min(offset, text_.size());
    error_ = std::move(message);
    return false;
  }
  // The byte the lexer took last (an opening bracket when called from open).
  std::size_t here() const { return consumed_ ? consumed_ - 1 : 0; }
  // The opening quote of the key just read: the lexer stops right after its
  // closing quote, and inside it every quote is preceded by an odd number of
  // backslashes.
  std::size_t key_start() const {
    for (std::size_t i = consumed_ - 1; i-- > 0;) {
      if (text_[i] != '"') continue;
      std::size_t slashes = 0;
      while (slashes < i && text_[i - 1 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 0) return i;
    }
    return 0;
  }

  const std::string& text_;
  const std::size_t& consumed_;
  std::vector<Frame> stack_;
  Json root_;
  std::size_t error_offset_ = 0;
  std::string error_;
};

namespace {
[[noreturn]] void malformed(const std::string& text, const std::string& what, std::size_t at,
                            const std::string& message) {
  const std::size_t line_start = at == 0 ? 0 : text.rfind('\n', at - 1) + 1;  // npos + 1 == 0
  const auto line = 1 + std::count(text.begin(), text.begin() + std::ptrdiff_t(at), '\n');
  throw IOError(what + ": malformed JSON at offset " + std::to_string(at) + " (line " + std::to_string(line) +
                ", column " + std::to_string(at - line_start + 1) + "): " + message);
}
}  // namespace

Json Json::parse(const std::string& text, const std::string& what) {
  // nlohmann skips a byte-order mark; RFC 8259 text has none.
  if (text.starts_with("\xEF\xBB\xBF")) malformed(text, what, 0, "a byte-order mark is not allowed");
  std::size_t consumed = 0;
  JsonSaxBuilder builder(text, consumed);
  const bool ok = nlohmann::json::sax_parse(CountingIterator(text.data(), 0, &consumed),
                                            CountingIterator(text.data(), text.size(), &consumed), &builder);
  // The lexer takes a NUL byte outside a string for the end of the input
  // (inside one it is a control character), so "1\0x" would pass as 1.
  const std::size_t nul = text.find('\0');
  if (ok && nul != std::string::npos) malformed(text, what, nul, "unexpected NUL byte");
  if (!ok) {
    const std::size_t at = builder.error_offset();
    if (at == nul && builder.error().find("end of input") != std::string::npos)
      malformed(text, what, at, "unexpected NUL byte");
    malformed(text, what, at, builder.error());
  }
  return builder.take();
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
  REMAT_CHECK(std::floor(number_) == number_, IOError, "JSON: expected an integer, got ", shortest(number_));
  REMAT_CHECK(!inexact_integer_, IOError, "JSON: expected an integer, got a number that only rounds to ",
              shortest(number_));
  REMAT_CHECK(std::abs(number_) < 9007199254740992.0, IOError, "JSON: expected an integer below 2^53 in magnitude ",
              "(larger ones are not exact), got ", shortest(number_));
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
// `s` itself when it is valid UTF-8; otherwise `s` with every invalid byte
// sequence replaced by U+FFFD (nlohmann's replacing serialiser), so every
// string remat writes parses back: the reader rejects invalid UTF-8, and a
// non-UTF-8 file path in a state's metadata must not make the state unreadable.
std::string valid_utf8(const std::string& s) {
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return s;
  const nlohmann::json j(s);
  try {
    (void)j.dump();
    return s;
  } catch (const nlohmann::json::type_error&) {
    return nlohmann::json::parse(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)).get<std::string>();
  }
}

void quote_into(std::string& out, const std::string& raw) {
  const std::string s = valid_utf8(raw);
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
