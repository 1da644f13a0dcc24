// A small JSON writer for the CLI's machine-readable output.
#pragma once

#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

namespace remat::tools {

// A JSON object with string, number and bool fields, written in insertion order.
class JsonObject {
 public:
  JsonObject& set(const std::string& key, const std::string& v) {
    fields_.emplace_back(key, quote(v));
    return *this;
  }
  JsonObject& set(const std::string& key, const char* v) { return set(key, std::string(v)); }
  JsonObject& set(const std::string& key, double v) {
    char buf[64];
    if (!std::isfinite(v))
      std::snprintf(buf, sizeof buf, "null");
    else if (v == std::floor(v) && std::abs(v) < 1e15)
      std::snprintf(buf, sizeof buf, "%.0f", v);
    else
      std::snprintf(buf, sizeof buf, "%.6g", v);
    fields_.emplace_back(key, buf);
    return *this;
  }
  JsonObject& set(const std::string& key, std::int64_t v) { return set(key, double(v)); }
  JsonObject& set(const std::string& key, int v) { return set(key, double(v)); }
  JsonObject& set(const std::string& key, bool v) {
    fields_.emplace_back(key, v ? "true" : "false");
    return *this;
  }
  JsonObject& set_raw(const std::string& key, const std::string& json) {
    fields_.emplace_back(key, json);
    return *this;
  }

  std::string str() const {
    std::string out = "{";
    for (std::size_t i = 0; i < fields_.size(); ++i) {
      if (i) out += ", ";
      out += quote(fields_[i].first) + ": " + fields_[i].second;
    }
    return out + "}";
  }

  static std::string quote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
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
    return out + "\"";
  }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

// "[obj, obj, ...]" with one object per line.
inline std::string json_array(const std::vector<JsonObject>& items) {
  std::string out = "[\n";
  for (std::size_t i = 0; i < items.size(); ++i) out += "  " + items[i].str() + (i + 1 < items.size() ? ",\n" : "\n");
  return out + "]\n";
}

}  // namespace remat::tools
