#include "tools/args.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <system_error>

#include "CLI/CLI.hpp"
#include "engine/device_runtime.h"
#include "engine/meta_mirror.h"
#include "engine/parallel_for.h"

namespace remat::tools {

namespace {

using Kind = FlagSpec::Kind;
constexpr std::int64_t kIntMin = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kIntMax = std::numeric_limits<std::int64_t>::max();

// The shortest text that reads back as `v` (3e-3 -> "0.003").
std::string format_number(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// Whole-string conversions (a leading '+' is allowed, whitespace is not).
std::optional<std::int64_t> parse_int(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  std::int64_t v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_double(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  double v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// The accepted values in words: "an integer >= 1", "a finite number in (0, 1024]".
std::string describe(const FlagSpec& s) {
  if (s.kind == Kind::integer) {
    const IntRange& r = s.ints;
    if (r.min == kIntMin && r.max == kIntMax) return "an integer";
    if (r.max == kIntMax) return "an integer >= " + std::to_string(r.min);
    if (r.min == kIntMin) return "an integer <= " + std::to_string(r.max);
    return "an integer in [" + std::to_string(r.min) + ", " + std::to_string(r.max) + "]";
  }
  if (s.kind == Kind::number) {
    const NumRange& r = s.nums;
    const bool lo = std::isfinite(r.min), hi = std::isfinite(r.max);
    if (!lo && !hi) return "a finite number";
    if (!hi) return std::string("a finite number ") + (r.min_open ? "> " : ">= ") + format_number(r.min);
    if (!lo) return std::string("a finite number ") + (r.max_open ? "< " : "<= ") + format_number(r.max);
    return std::string("a finite number in ") + (r.min_open ? "(" : "[") + format_number(r.min) + ", " +
           format_number(r.max) + (r.max_open ? ")" : "]");
  }
  return s.kind == Kind::boolean ? "nothing (a boolean flag)" : "text";
}

// The value placeholder --help shows after the flag's name.
std::string type_name(const FlagSpec& s) {
  switch (s.kind) {
    case Kind::text:
      return "TEXT";
    case Kind::boolean:
      return "";
    case Kind::integer: {
      const std::string d = describe(s);  // "an integer..." -> "INT..."
      return "INT" + d.substr(std::string("an integer").size());
    }
    case Kind::number: {
      const std::string d = describe(s);
      return "FLOAT" + d.substr(std::string("a finite number").size());
    }
  }
  return "";
}

bool in_range(const FlagSpec& s, const std::string& text) {
  if (s.kind == Kind::integer) {
    const auto v = parse_int(text);
    return v && *v >= s.ints.min && *v <= s.ints.max;
  }
  if (s.kind == Kind::number) {
    const auto v = parse_double(text);
    if (!v || !std::isfinite(*v)) return false;
    const NumRange& r = s.nums;
    const bool lo_ok = r.min_open ? *v > r.min : *v >= r.min;
    const bool hi_ok = r.max_open ? *v < r.max : *v <= r.max;
    return lo_ok && hi_ok;
  }
  return true;
}

// "help (default D)"; a text flag's "" default goes unsaid.
std::string help_with_default(const FlagSpec& s) {
  return s.fallback && !s.fallback->empty() ? s.help + " (default " + *s.fallback + ")" : s.help;
}

std::string valid_list(const std::vector<FlagSpec>& specs) {
  std::string out;
  for (const FlagSpec& s : specs) {
    out += "\n  --" + s.name;
    if (const std::string t = type_name(s); !t.empty()) out += " " + t;
    out += "  " + help_with_default(s);
  }
  return out + "\n  -h, --help  print these flags and exit";
}

}  // namespace

FlagSpec text_flag(std::string name, std::string help, std::string fallback) {
  return FlagSpec{std::move(name), Kind::text, std::move(help), std::move(fallback), {}, {}};
}

FlagSpec int_flag(std::string name, std::string help, std::optional<std::int64_t> fallback, IntRange range) {
  std::optional<std::string> text;
  if (fallback) text = std::to_string(*fallback);
  return FlagSpec{std::move(name), Kind::integer, std::move(help), std::move(text), range, {}};
}

FlagSpec number_flag(std::string name, std::string help, std::optional<double> fallback, NumRange range) {
  std::optional<std::string> text;
  if (fallback) text = format_number(*fallback);
  return FlagSpec{std::move(name), Kind::number, std::move(help), std::move(text), {}, range};
}

FlagSpec bool_flag(std::string name, std::string help) {
  return FlagSpec{std::move(name), Kind::boolean, std::move(help), std::nullopt, {}, {}};
}

Flags::Flags(std::string command, std::string about, const std::vector<std::string>& args, std::vector<FlagSpec> specs)
    : command_(std::move(command)), specs_(std::move(specs)) {
  CLI::App app(std::move(about), "remat " + command_);
  app.set_help_flag("-h,--help", "print these flags and exit");
  app.allow_extras();  // unknown flags and stray arguments are reported below, with the valid flags
  app.get_formatter()->column_width(40);

  // CLI11 binds each valued flag to a slot here; std::map nodes do not move.
  std::map<std::string, std::string> texts;
  std::map<std::string, CLI::Option*> options;
  std::set<std::string> names;
  for (const FlagSpec& s : specs_) {
    REMAT_CHECK(names.insert(s.name).second, Error, command_, ": flag --", s.name, " is declared twice");
    REMAT_CHECK(!s.fallback || in_range(s, *s.fallback), Error, command_, ": the default '", *s.fallback,
                "' of --", s.name, " is not ", describe(s));
    CLI::Option* o = nullptr;
    if (s.kind == Kind::boolean) {
      o = app.add_flag("--" + s.name, s.help);
    } else {
      o = app.add_option("--" + s.name, texts[s.name], help_with_default(s));
      o->type_name(type_name(s));
      o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
    options[s.name] = o;
  }
  help_ = app.help();

  // CLI11 takes the arguments last first.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    throw HelpRequested(help_);
  } catch (const CLI::ArgumentMismatch& e) {
    // A valued flag ran out of arguments: it is the last one given.
    const std::string last = args.empty() ? "" : args.back();
    if (last.rfind("--", 0) == 0) {
      const std::string name = last.substr(2, last.find('=') - 2);  // npos - 2 is still "to the end"
      if (options.count(name)) throw Error(detail::concat("flag --", name, " needs a value"));
    }
    throw Error(detail::concat("flag error: ", e.what(), "; valid flags:", valid_list(specs_)));
  } catch (const CLI::ParseError& e) {
    throw Error(detail::concat("flag error: ", e.what(), "; valid flags:", valid_list(specs_)));
  }

  const std::vector<std::string> extra = app.remaining();
  if (!extra.empty()) {
    const std::string& a = extra.front();
    if (a.size() > 2 && a.rfind("--", 0) == 0)
      throw Error(detail::concat("unknown flag ", a.substr(0, a.find('=')), "; valid flags:", valid_list(specs_)));
    throw Error(detail::concat("unexpected argument '", a, "'; valid flags:", valid_list(specs_)));
  }

  for (const FlagSpec& s : specs_) {
    if (options.at(s.name)->count() == 0) continue;
    if (s.kind == Kind::boolean) {  // CLI11 hands --flag over as "true", --flag=V as V
      const std::string v = options.at(s.name)->results().back();
      REMAT_CHECK(v == "true" || v == "false" || v == "1" || v == "0", Error, "flag --", s.name,
                  " is a boolean flag: give it alone (or =true, =false), got '", v, "'");
      values_[s.name] = v == "true" || v == "1" ? "true" : "false";
      continue;
    }
    const std::string& v = texts.at(s.name);
    REMAT_CHECK(in_range(s, v), Error, "flag --", s.name, " expects ", describe(s), ", got '", v, "'");
    values_[s.name] = v;
  }
}

const FlagSpec& Flags::spec(const std::string& name, FlagSpec::Kind kind) const {
  const auto it = std::find_if(specs_.begin(), specs_.end(), [&](const FlagSpec& s) { return s.name == name; });
  REMAT_CHECK(it != specs_.end(), Error, command_, ": no flag --", name, " is declared");
  REMAT_CHECK(it->kind == kind || kind == Kind::text, Error, command_, ": flag --", name, " is not read as ",
              describe(FlagSpec{name, kind, "", std::nullopt, {}, {}}));
  return *it;
}

std::string Flags::value_or_default(const FlagSpec& s) const {
  const auto it = values_.find(s.name);
  if (it != values_.end()) return it->second;
  REMAT_CHECK(s.fallback.has_value(), Error, command_, ": --", s.name, " was not given and has no default");
  return *s.fallback;
}

std::string Flags::get(const std::string& name) const { return value_or_default(spec(name, Kind::text)); }

std::int64_t Flags::get_int(const std::string& name) const {
  return *parse_int(value_or_default(spec(name, Kind::integer)));  // checked when parsed
}

double Flags::get_double(const std::string& name) const {
  return *parse_double(value_or_default(spec(name, Kind::number)));  // checked when parsed
}

bool Flags::get_bool(const std::string& name) const {
  spec(name, Kind::boolean);
  const auto it = values_.find(name);
  return it != values_.end() && it->second == "true";
}

FlagSpec threads_flag_spec() {
  return int_flag("threads", "CPU threads (default: all cores)", std::nullopt, {.min = 1, .max = 1024});
}

void apply_threads_flag(const Flags& f) {
  if (f.has("threads")) set_num_threads(int(f.get_int("threads")));
}

Device device_flag(const Flags& f, bool meta_ok) {
  const Device device = Device::parse(f.get("device"));
  REMAT_CHECK(meta_ok || !device.is_meta(), DeviceError, "--device meta runs on shapes alone and ", f.command(),
              " needs values (real data, losses, weights); for memory and plans use `mem --device meta` "
              "or `plan --device meta` (docs/META.md)");
  if (f.has("meta-kernels")) {
    const std::string mk = f.get("meta-kernels");
    REMAT_CHECK(mk == "cpu" || mk == "cuda", Error, f.command(), ": --meta-kernels ", mk, ": expected cpu or cuda");
    REMAT_CHECK(device.is_meta(), Error, f.command(), ": --meta-kernels ", mk, " needs --device meta (got ",
                device.str(), ")");
    set_meta_kernels(mk == "cuda" ? DeviceType::CUDA : DeviceType::CPU);  // (this process's run)
  }
  use_device_if_present(device);
  return device;
}

FlagSpec meta_kernels_flag_spec() {
  return text_flag("meta-kernels", "with --device meta, the kernels it runs on shapes: cpu (the CPU's allocations, "
                   "the default) or cuda (a GPU run's: CUDA's op code, launching nothing; docs/META.md)");
}

}  // namespace remat::tools
