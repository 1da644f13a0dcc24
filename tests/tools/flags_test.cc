// tools/args: the CLI's flag parser (CLI11 underneath): --name value,
// --name=value, boolean flags, defaults, the checks on kinds and ranges made
// when the flags are parsed, the error texts, and -h/--help.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "engine/error.h"
#include "tools/args.h"

using remat::Error;
using remat::tools::bool_flag;
using remat::tools::Flags;
using remat::tools::HelpRequested;
using remat::tools::int_flag;
using remat::tools::number_flag;
using remat::tools::text_flag;

namespace {

Flags parse(const std::vector<std::string>& args) {
  return Flags("demo", "a command to test the parser", args,
               {text_flag("config", "model config", "tiny"),
                text_flag("out", "output file"),
                int_flag("steps", "optimizer steps", 600, {.min = 1}),
                int_flag("seed", "seed", 0, {.min = 0}),
                int_flag("reuse", "0 or 1", 1, {.min = 0, .max = 1}),
                number_flag("lr", "peak learning rate", 3e-3, {.min = 0, .min_open = true}),
                number_flag("bucket-mb", "bucket size in MiB", 25, {.min = 0, .min_open = true, .max = 1024}),
                number_flag("peak", "peak FLOP/s", std::nullopt, {.min = 0, .min_open = true}),
                bool_flag("estimate", "predict instead of measuring")});
}

std::string error_of(const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const HelpRequested&) {
    return "(help)";
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("flags: defaults when nothing is given", "[tools][flags]") {
  const Flags f = parse({});
  CHECK_FALSE(f.has("config"));
  CHECK(f.get("config") == "tiny");
  CHECK(f.get("out").empty());
  CHECK(f.get_int("steps") == 600);
  CHECK(f.get("steps") == "600");
  CHECK(f.get_double("lr") == 3e-3);
  CHECK(f.get("lr") == "0.003");
  CHECK_FALSE(f.get_bool("estimate"));
  CHECK_FALSE(f.has("peak"));
  CHECK_THROWS_WITH(f.get_double("peak"), Catch::Contains("--peak was not given and has no default"));
  CHECK_THROWS_WITH(f.get_int("lr"), Catch::Contains("--lr is not read as an integer"));
  CHECK_THROWS_WITH(f.get("nope"), Catch::Contains("no flag --nope is declared"));
}

TEST_CASE("flags: --name value, --name=value, booleans, the last repeat wins", "[tools][flags]") {
  const Flags f = parse({"--config", "tiny-moe", "--steps=7", "--lr", "1e-2", "--estimate", "--seed", "3",
                         "--seed", "4", "--out=a=b", "--peak", "+2.5e12"});
  CHECK(f.get("config") == "tiny-moe");
  CHECK(f.get_int("steps") == 7);
  CHECK(f.get_double("lr") == 1e-2);
  CHECK(f.get_bool("estimate"));
  CHECK(f.get_int("seed") == 4);
  CHECK(f.get("out") == "a=b");
  CHECK(f.get_double("peak") == 2.5e12);
  CHECK(f.has("steps"));
  CHECK_FALSE(f.has("reuse"));
  // A value that starts with a dash is a value, not a flag.
  CHECK(parse({"--out", "-"}).get("out") == "-");
  CHECK_FALSE(parse({"--estimate=false"}).get_bool("estimate"));
  CHECK(parse({"--estimate=1"}).get_bool("estimate"));
  CHECK(error_of({"--estimate=maybe"}) ==
        "flag --estimate is a boolean flag: give it alone (or =true, =false), got 'maybe'");
}

TEST_CASE("flags: unknown flags and stray arguments list the valid flags", "[tools][flags]") {
  const std::string unknown = error_of({"--steps", "3", "--stpes", "4"});
  CHECK_THAT(unknown, Catch::StartsWith("unknown flag --stpes; valid flags:"));
  CHECK_THAT(unknown, Catch::Contains("\n  --steps INT >= 1  optimizer steps (default 600)"));
  CHECK_THAT(unknown, Catch::Contains("\n  --lr FLOAT > 0  peak learning rate (default 0.003)"));
  CHECK_THAT(unknown, Catch::Contains("\n  --estimate  predict instead of measuring"));
  CHECK_THAT(unknown, Catch::Contains("-h, --help"));
  CHECK_THAT(error_of({"--nope=3"}), Catch::StartsWith("unknown flag --nope; valid flags:"));
  CHECK_THAT(error_of({"stray"}), Catch::StartsWith("unexpected argument 'stray'; valid flags:"));
  CHECK_THAT(error_of({"-x"}), Catch::StartsWith("unexpected argument '-x'; valid flags:"));
}

TEST_CASE("flags: a flag without its value", "[tools][flags]") {
  CHECK(error_of({"--steps"}) == "flag --steps needs a value");
  CHECK(error_of({"--seed", "1", "--config"}) == "flag --config needs a value");
}

TEST_CASE("flags: integers are checked for kind and range when parsed", "[tools][flags]") {
  CHECK(error_of({"--steps", "abc"}) == "flag --steps expects an integer >= 1, got 'abc'");
  CHECK(error_of({"--steps", "12x"}) == "flag --steps expects an integer >= 1, got '12x'");
  CHECK(error_of({"--steps", "1.5"}) == "flag --steps expects an integer >= 1, got '1.5'");
  CHECK(error_of({"--steps", "0"}) == "flag --steps expects an integer >= 1, got '0'");
  CHECK(error_of({"--steps="}) == "flag --steps needs a value");
  CHECK(error_of({"--seed", "-1"}) == "flag --seed expects an integer >= 0, got '-1'");
  CHECK(error_of({"--reuse", "2"}) == "flag --reuse expects an integer in [0, 1], got '2'");
  CHECK(error_of({"--seed", "99999999999999999999"}) ==
        "flag --seed expects an integer >= 0, got '99999999999999999999'");
  CHECK(parse({"--reuse", "0"}).get_int("reuse") == 0);
}

TEST_CASE("flags: numbers must be finite and in range", "[tools][flags]") {
  for (const std::string bad : {"nan", "NaN", "inf", "-inf", "infinity", "1e999", "-1", "0", "-0", "x", "1e-3x"})
    CHECK(error_of({"--lr", bad}) == "flag --lr expects a finite number > 0, got '" + bad + "'");
  CHECK(error_of({"--bucket-mb", "-3"}) == "flag --bucket-mb expects a finite number in (0, 1024], got '-3'");
  CHECK(error_of({"--bucket-mb", "1025"}) == "flag --bucket-mb expects a finite number in (0, 1024], got '1025'");
  CHECK(parse({"--bucket-mb", "1024"}).get_double("bucket-mb") == 1024);
  CHECK(parse({"--lr", "1e-300"}).get_double("lr") == 1e-300);
}

TEST_CASE("flags: -h and --help give the flags with help, kind, range and default", "[tools][flags]") {
  for (const std::string h : {"-h", "--help"}) {
    std::string text;
    try {
      parse({"--steps", "3", h});
    } catch (const HelpRequested& e) {
      text = e.what();
    }
    CHECK_THAT(text, Catch::Contains("a command to test the parser"));
    CHECK_THAT(text, Catch::Contains("Usage: remat demo"));
    CHECK_THAT(text, Catch::Contains("--steps INT >= 1"));
    CHECK_THAT(text, Catch::Contains("optimizer steps (default 600)"));
    CHECK_THAT(text, Catch::Contains("peak learning rate (default 0.003)"));
    CHECK_THAT(text, Catch::Contains("--bucket-mb FLOAT in (0, 1024]"));
    CHECK_THAT(text, Catch::Contains("model config (default tiny)"));
    CHECK_THAT(text, Catch::Contains("--estimate"));
    CHECK_THAT(text, Catch::Contains("-h,--help"));
    CHECK(text == parse({}).help());
  }
}

TEST_CASE("flags: a declaration whose default is out of its range is refused", "[tools][flags]") {
  CHECK_THROWS_WITH(Flags("demo", "", {}, {int_flag("steps", "", 0, {.min = 1})}),
                    Catch::Contains("the default '0' of --steps is not an integer >= 1"));
  CHECK_THROWS_WITH(Flags("demo", "", {}, {text_flag("a", ""), text_flag("a", "")}),
                    Catch::Contains("flag --a is declared twice"));
}
