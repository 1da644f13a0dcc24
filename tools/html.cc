#include "tools/html.h"

#include <cstdarg>
#include <cstdio>

namespace remat::tools {

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  const int n = std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  if (n < 0) return "";
  if (std::size_t(n) < sizeof buf) return std::string(buf, std::size_t(n));
  std::string out(std::size_t(n) + 1, '\0');
  va_start(ap, f);
  std::vsnprintf(out.data(), out.size(), f, ap);
  va_end(ap);
  out.resize(std::size_t(n));
  return out;
}


std::string page_style() {
  return "<style>\n"
       "body { font-family: Helvetica, Arial, sans-serif; margin: 16px; color: #222; background: #fff; }\n"
       "h1 { font-size: 22px; margin: 0 0 6px 0; }\n"
       "h2 { font-size: 16px; margin: 22px 0 8px 0; }\n"
       "p.summary { margin: 4px 0 4px 0; font-size: 14px; }\n"
       "p.info { margin: 0 0 12px 0; font-size: 12px; color: #555; }\n"
       ".tables { display: flex; flex-wrap: wrap; gap: 36px; align-items: flex-start; }\n"
       "table { border-collapse: collapse; font-size: 13px; }\n"
       "th, td { padding: 3px 10px; border-bottom: 1px solid #e2e2e2; text-align: left; }\n"
       "td.n { text-align: right; font-variant-numeric: tabular-nums; }\n"
       "th { background: #f3f3f3; }\n"
       ".sw { display: inline-block; width: 11px; height: 11px; margin-right: 6px; vertical-align: -1px; }\n"
       ".bar { display: inline-block; height: 10px; background: #e15759; vertical-align: 0; }\n"
       "p.note { color: #666; font-size: 12px; max-width: 1100px; }\n"
       "</style>\n";
}

}  // namespace remat::tools
