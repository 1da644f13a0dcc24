// Small helpers for the self-contained HTML pages the CLI writes (`mem`,
// `bench --html`): escaping, printf-style formatting and the shared style.
#pragma once

#include <string>

namespace remat::tools {

// `s` with &, <, >, " and ' escaped for HTML text and attributes.
std::string html_escape(const std::string& s);
// printf into a std::string.
std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
// The <style> element every page shares (fonts, headings, tables).
std::string page_style();

}  // namespace remat::tools
