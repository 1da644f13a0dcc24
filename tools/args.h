// Command-line flags of the CLI, parsed by CLI11: --name value, --name=value,
// and boolean flags given without a value (the last of repeated flags wins).
// Each command declares its flags with a kind, help, default and range; every
// given value is converted and range-checked when Flags is built, so a bad
// value fails before the command does any work. Unknown flags are an error
// that lists the valid ones; -h/--help throws HelpRequested with the help text.
#pragma once

#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/error.h"

namespace remat::tools {

// The values an integer flag accepts: [min, max].
struct IntRange {
  std::int64_t min = std::numeric_limits<std::int64_t>::min();
  std::int64_t max = std::numeric_limits<std::int64_t>::max();
};

// The values a number flag accepts: always finite, and within min .. max
// (each bound inclusive unless its *_open is set; an infinite bound is none).
struct NumRange {
  double min = -std::numeric_limits<double>::infinity();
  bool min_open = false;
  double max = std::numeric_limits<double>::infinity();
  bool max_open = false;
};

// One flag a command accepts. Build them with text_flag/int_flag/number_flag/bool_flag.
struct FlagSpec {
  enum class Kind { text, integer, number, boolean };
  std::string name;  // without the leading "--"
  Kind kind = Kind::text;
  std::string help;
  std::optional<std::string> fallback;  // the default as it would be typed; shown by --help
  IntRange ints;                        // Kind::integer only
  NumRange nums;                        // Kind::number only
};

// A text flag defaults to "" unless given a default.
FlagSpec text_flag(std::string name, std::string help, std::string fallback = "");
FlagSpec int_flag(std::string name, std::string help, std::optional<std::int64_t> fallback, IntRange range = {});
FlagSpec number_flag(std::string name, std::string help, std::optional<double> fallback, NumRange range = {});
FlagSpec bool_flag(std::string name, std::string help);

// Thrown by Flags for -h/--help: what() is the command's help (its flags with
// help text, kind, range and default). main prints it to stdout and exits 0.
class HelpRequested : public std::exception {
 public:
  explicit HelpRequested(std::string text) : text_(std::move(text)) {}
  const char* what() const noexcept override { return text_.c_str(); }

 private:
  std::string text_;
};

class Flags {
 public:
  // Parses `args` (argv after the command name) for `command` ("remat
  // <command>", described by `about`), accepting only the flags in `specs`.
  // Throws Error on an unknown flag or stray argument (listing the valid
  // flags), a missing value, or a value that is not of the flag's kind or not
  // in its range (naming the flag, the value and the valid range); throws
  // HelpRequested for -h/--help.
  Flags(std::string command, std::string about, const std::vector<std::string>& args, std::vector<FlagSpec> specs);

  // Whether the flag was given on the command line.
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  // The given value, else the declared default, as text (any kind). Throws
  // Error when the flag was not given and has no default (text flags always
  // have one: "" unless declared).
  std::string get(const std::string& name) const;
  // The given (checked) value, else the declared default; the flag must be of
  // that kind. Throws Error when the flag was not given and has no default.
  std::int64_t get_int(const std::string& name) const;
  double get_double(const std::string& name) const;
  // Whether a boolean flag is set (--flag, --flag=true; --flag=false clears it).
  bool get_bool(const std::string& name) const;
  // The command these flags are for ("train", "mem", ...).
  const std::string& command() const { return command_; }

  // The text -h/--help prints.
  const std::string& help() const { return help_; }

 private:
  const FlagSpec& spec(const std::string& name, FlagSpec::Kind kind) const;
  std::string value_or_default(const FlagSpec& s) const;

  std::string command_;
  std::vector<FlagSpec> specs_;
  std::map<std::string, std::string> values_;  // the flags given, as typed ("true"/"false" for booleans)
  std::string help_;
};

// --threads N (1 .. 1024; default: all cores), shared by every command, and
// the call that applies it (set_num_threads when given).
FlagSpec threads_flag_spec();
void apply_threads_flag(const Flags& f);

// --device (default cpu): cpu, cuda or cuda:N, and meta where `meta_ok`
// (commands that read values refuse it, naming the ones that take it). A
// CUDA device that is present becomes the thread's current one, so kernels,
// cuBLASLt and the default stream run where the memory is (an absent one
// fails later, naming it).
// With --meta-kernels given (commands that declare it), sets the kernels
// meta runs (engine/meta_mirror.h); Error for a value other than cpu or
// cuda, or for it without --device meta.
Device device_flag(const Flags& f, bool meta_ok = false);

// --meta-kernels cpu|cuda, for the commands that take --device meta and
// report its bytes (mem, plan, dump): whose kernels meta runs on shapes, the
// CPU's (the default) or CUDA's (a GPU run's allocations; a build with the
// CUDA back end, no GPU needed).
FlagSpec meta_kernels_flag_spec();

}  // namespace remat::tools
