// A small JSON writer for the CLI's machine-readable output: objects whose
// fields keep their insertion order (engine/json.h sorts keys).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/json.h"

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
    fields_.emplace_back(key, Json::format_number(v, 6));
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

  static std::string quote(const std::string& s) { return Json::quote(s); }

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
