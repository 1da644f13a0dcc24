// engine/json: the strict parser (nlohmann-json underneath) and the writer
// whose output files depend on (safetensors headers, configs, bench rows).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "engine/error.h"
#include "engine/json.h"

using namespace remat;

namespace {

// The message Json::parse throws for `text`, or "" when it parses.
std::string parse_error(const std::string& text, const std::string& what = "input.json") {
  try {
    Json::parse(text, what);
  } catch (const IOError& e) {
    return e.what();
  }
  return "";
}

std::string nested(int depth, const std::string& inner = "") {
  return std::string(std::size_t(depth), '[') + inner + std::string(std::size_t(depth), ']');
}

}  // namespace

TEST_CASE("parse builds values; members iterate in key order", "[json]") {
  const Json j = Json::parse(R"( {"b": [1, -2.5, "x", true, false, null], "a": {}, "c": {"k": "v"}} )");
  REQUIRE(j.is_object());
  std::string keys;
  for (const auto& [k, v] : j.members()) keys += k;
  CHECK(keys == "abc");
  const auto& b = j.at("b").items();
  REQUIRE(b.size() == 6);
  CHECK(b[0].as_int() == 1);
  CHECK(b[1].as_number() == -2.5);
  CHECK(b[2].as_string() == "x");
  CHECK(b[3].as_bool());
  CHECK_FALSE(b[4].as_bool());
  CHECK(b[5].is_null());
  CHECK(j.at("a").members().empty());
  CHECK(j.at("c").at("k").as_string() == "v");
  CHECK(Json::parse("\t\r\n 7 \n").as_int() == 7);  // JSON's four whitespace bytes
  CHECK(Json::parse("[]").items().empty());
  CHECK(Json::parse("\"\"").as_string().empty());
}

TEST_CASE("dump keeps its exact format: sorted keys, no spaces, remat's numbers and escapes", "[json]") {
  // A safetensors-style header: files written before the parser changed must
  // come out byte for byte the same.
  Json entry = Json::object();
  entry.set("dtype", Json::string("F32"));
  entry.set("shape", Json::array({Json::number(2), Json::number(3)}));
  entry.set("data_offsets", Json::array({Json::number(0), Json::number(24)}));
  Json meta = Json::object();
  meta.set("step", Json::string("12"));
  Json header = Json::object();
  header.set("w", entry);
  header.set("__metadata__", meta);
  CHECK(header.dump() ==
        R"({"__metadata__":{"step":"12"},"w":{"data_offsets":[0,24],"dtype":"F32","shape":[2,3]}})");

  Json nums = Json::array({Json::number(0.1), Json::number(1e15), Json::number(123456789012345.0),
                           Json::number(-0.0), Json::number(NAN), Json::number(INFINITY), Json::number(1e-7),
                           Json::number(-3)});
  CHECK(nums.dump() == "[0.10000000000000001,1000000000000000,123456789012345,-0,null,null,9.9999999999999995e-08,-3]");
  CHECK(Json::format_number(1e17) == "1e+17");
  CHECK(Json::format_number(-999999999999999.0) == "-999999999999999");
  CHECK(Json::format_number(0.1, 6) == "0.1");
  CHECK(Json::format_number(2.5e-5, 6) == "2.5e-05");

  // Only " \ \n \r \t get short escapes; other control bytes \u00XX; the rest
  // (DEL, '/', UTF-8) is written as it is.
  CHECK(Json::quote("q\"b\\n\nr\rt\tb\bf\f\x01\x1f\x7f/\xc3\xa9") ==
        "\"q\\\"b\\\\n\\nr\\rt\\tb\\u0008f\\u000c\\u0001\\u001f\x7f/\xc3\xa9\"");
  CHECK(Json::string(std::string("a\0b", 3)).dump() == "\"a\\u0000b\"");
}

TEST_CASE("dump output parses back to the same dump", "[json]") {
  for (const char* text : {R"({"z":[1,2,{"y":null}],"a":"\u00e9\"\n","m":-0.0,"n":1e300,"s":"\ud83d\ude00"})",
                           "[-0,0,-1.5e-300,18446744073709551616,true]", "\"\\u0000\\u001f\""}) {
    INFO(text);
    const std::string once = Json::parse(text).dump();
    CHECK(Json::parse(once).dump() == once);
  }
  // -0 stays negative (the integer token "-0" as well as "-0.0").
  CHECK(std::signbit(Json::parse("-0").as_number()));
  CHECK(std::signbit(Json::parse("-0.0").as_number()));
  CHECK_FALSE(std::signbit(Json::parse("0").as_number()));
}

TEST_CASE("messages name the source, the byte offset, the line and the column", "[json]") {
  CHECK(parse_error("[1,]", "model.json") ==
        "model.json: malformed JSON at offset 3 (line 1, column 4): syntax error while parsing value - "
        "unexpected ']'; expected '[', '{', or a literal");
  const std::string multi = parse_error("{\n  \"a\": 1,\n  \"b\": x\n}", "cfg");
  CHECK_THAT(multi, Catch::StartsWith("cfg: malformed JSON at offset 19 (line 3, column 8): "));
  CHECK_THAT(parse_error("", "empty.json"), Catch::StartsWith("empty.json: malformed JSON at offset 0 (line 1, "
                                                              "column 1): "));
  CHECK_THAT(parse_error("  "), Catch::Contains("at offset 2 ") && Catch::Contains("unexpected end of input"));
  CHECK_THAT(parse_error("{\"a\":"), Catch::Contains("at offset 5 ") && Catch::Contains("end of input"));
  CHECK_THAT(parse_error("tru"), Catch::Contains("at offset 3 ") && Catch::Contains("invalid literal"));
  CHECK_THAT(parse_error("True"), Catch::Contains("at offset 0 ") && Catch::Contains("invalid literal"));
  CHECK_THAT(parse_error("{a:1}"), Catch::Contains("at offset 1 ") && Catch::Contains("invalid literal"));
  CHECK_THAT(parse_error("{\"a\" 1}"), Catch::Contains("at offset 5 ") && Catch::Contains("expected ':'"));
  CHECK_THAT(parse_error("[1 2]"), Catch::Contains("at offset 3 ") && Catch::Contains("expected ']'"));
  CHECK_THAT(parse_error("{\"a\":1,}"), Catch::Contains("at offset 7 ") && Catch::Contains("object key"));
  CHECK_THAT(parse_error("[1,2"), Catch::Contains("at offset 4 "));
  CHECK_THAT(parse_error("\"abc"), Catch::Contains("at offset 4 ") && Catch::Contains("missing closing quote"));
  CHECK_THAT(parse_error("1\f"), Catch::Contains("at offset 1 "));  // form feed is not whitespace
  CHECK_THAT(parse_error("// c\n1"), Catch::Contains("at offset 0 "));  // no comments
  // The library's own "[json.exception...] parse error at line..." prefix is dropped.
  CHECK_THAT(parse_error("[1,]"), !Catch::Contains("json.exception") && !Catch::Contains("parse error at"));
}

TEST_CASE("trailing characters after the value are an error", "[json]") {
  CHECK_THAT(parse_error("1 x"), Catch::Contains("at offset 2 ") && Catch::Contains("expected end of input"));
  CHECK_THAT(parse_error("{} {}"), Catch::Contains("at offset 3 ") && Catch::Contains("expected end of input"));
  CHECK_THAT(parse_error("[1]]"), Catch::Contains("at offset 3 ") && Catch::Contains("expected end of input"));
  CHECK_THAT(parse_error("\"a\"\"b\""), Catch::Contains("expected end of input"));
  // A NUL byte does not end the text early.
  CHECK(parse_error(std::string("1\0", 2)) ==
        "input.json: malformed JSON at offset 1 (line 1, column 2): unexpected NUL byte");
  CHECK(parse_error(std::string("{}\0{\"a\":1}", 10)) ==
        "input.json: malformed JSON at offset 2 (line 1, column 3): unexpected NUL byte");
  CHECK(parse_error(std::string("[1,\0]", 5)) ==
        "input.json: malformed JSON at offset 3 (line 1, column 4): unexpected NUL byte");
  CHECK(Json::parse("[1] \n\t").items().size() == 1);
}

TEST_CASE("duplicate keys are an error at the second key", "[json]") {
  CHECK(parse_error(R"({"a":1,"a":2})", "h") ==
        "h: malformed JSON at offset 7 (line 1, column 8): duplicate key \"a\"");
  // The same key after unescaping, in a nested object, with quotes and
  // backslashes inside the key.
  CHECK_THAT(parse_error(R"({"a":1, "\u0061":2})"), Catch::Contains("at offset 8 ") &&
                                                         Catch::Contains("duplicate key \"a\""));
  CHECK_THAT(parse_error(R"({"o":{"k":1,"k":[]}})"), Catch::Contains("at offset 12 ") &&
                                                         Catch::Contains("duplicate key \"k\""));
  CHECK_THAT(parse_error(R"({"x\"\\":1,"x\"\\":2})"),
             Catch::Contains("at offset 11 ") && Catch::Contains(R"(duplicate key "x\"\\")"));
  CHECK_THAT(parse_error("{\"\":1,\n \"\":2}"), Catch::Contains("at offset 8 (line 2, column 2)"));
  // Equal keys in different objects, or differing keys, are fine.
  const Json ok = Json::parse(R"({"a":{"a":1},"b":[{"a":1},{"a":2}],"A":0})");
  CHECK(ok.members().size() == 3);
  CHECK(ok.at("b").items()[1].at("a").as_int() == 2);
}

TEST_CASE("nesting deeper than 64 arrays or objects is an error", "[json]") {
  CHECK(Json::parse(nested(64)).is_array());
  CHECK(Json::parse(nested(64, "1")).is_array());
  CHECK(parse_error(nested(65)) ==
        "input.json: malformed JSON at offset 64 (line 1, column 65): nested deeper than 64 arrays/objects");
  std::string objects;
  for (int i = 0; i < 64; ++i) objects += "{\"k\":";
  CHECK(Json::parse(objects + "1" + std::string(64, '}')).is_object());
  CHECK_THAT(parse_error(objects + "[]" + std::string(64, '}')), Catch::Contains("at offset 320 ") &&
                                                                    Catch::Contains("nested deeper than 64"));
  // Far deeper input fails at the limit, without recursing through it.
  CHECK_THAT(parse_error(std::string(1000000, '[')), Catch::Contains("at offset 64 "));
  // Siblings do not add depth.
  std::string wide = "[";
  for (int i = 0; i < 1000; ++i) wide += (i ? "," : "") + nested(60);
  CHECK(Json::parse(wide + "]").items().size() == 1000);
}

TEST_CASE("unicode escapes decode to UTF-8, surrogate pairs included", "[json]") {
  CHECK(Json::parse(R"("\u0041\u00e9\u00E9\u20ac")").as_string() == "A\xc3\xa9\xc3\xa9\xe2\x82\xac");
  CHECK(Json::parse(R"("\ud83d\ude00")").as_string() == "\xf0\x9f\x98\x80");    // U+1F600
  CHECK(Json::parse(R"("\uD800\uDC00")").as_string() == "\xf0\x90\x80\x80");    // U+10000
  CHECK(Json::parse(R"("\udbff\udfff")").as_string() == "\xf4\x8f\xbf\xbf");    // U+10FFFF
  CHECK(Json::parse(R"("\u0000")").as_string() == std::string(1, '\0'));
  CHECK(Json::parse(R"("\"\\\/\b\f\n\r\t")").as_string() == "\"\\/\b\f\n\r\t");
  CHECK_THAT(parse_error(R"("\ud800")"), Catch::Contains("surrogate"));           // lone high
  CHECK_THAT(parse_error(R"("\udc00")"), Catch::Contains("surrogate"));           // lone low
  CHECK_THAT(parse_error(R"("\ud800\u0041")"), Catch::Contains("surrogate"));     // high, not low
  CHECK_THAT(parse_error(R"("\ud800x")"), Catch::Contains("surrogate"));
  CHECK_THAT(parse_error(R"("\u12g4")"), Catch::Contains("must be followed by 4 hex digits"));
  CHECK_THAT(parse_error(R"("\u12")"), Catch::Contains("must be followed by 4 hex digits"));
  CHECK_THAT(parse_error(R"("\x")"), Catch::Contains("after backslash"));
  CHECK_THAT(parse_error(R"("\U0041")"), Catch::Contains("after backslash"));
}

TEST_CASE("strings must be valid UTF-8 without raw control characters", "[json]") {
  // Raw UTF-8 passes through unchanged.
  CHECK(Json::parse("\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\x7f\"").as_string() ==
        "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\x7f");
  // Invalid UTF-8 is rejected (RFC 8259 section 8.1; safetensors headers are
  // UTF-8), at the offending byte.
  CHECK_THAT(parse_error("\"ab\xff\""), Catch::Contains("at offset 3 ") && Catch::Contains("ill-formed UTF-8"));
  CHECK_THAT(parse_error("\"\x80\""), Catch::Contains("ill-formed UTF-8"));          // stray continuation
  CHECK_THAT(parse_error("\"\xc0\xaf\""), Catch::Contains("ill-formed UTF-8"));      // overlong '/'
  CHECK_THAT(parse_error("\"\xe0\x80\xaf\""), Catch::Contains("ill-formed UTF-8"));  // overlong
  CHECK_THAT(parse_error("\"\xed\xa0\x80\""), Catch::Contains("ill-formed UTF-8"));  // UTF-8 surrogate
  CHECK_THAT(parse_error("\"\xf4\x90\x80\x80\""), Catch::Contains("ill-formed UTF-8"));  // above U+10FFFF
  CHECK_THAT(parse_error("\"\xe2\x82\""), Catch::Contains("ill-formed UTF-8"));      // truncated
  CHECK_THAT(parse_error("{\"k\xfe\":1}"), Catch::Contains("at offset 3 "));          // in a key too
  CHECK_THAT(parse_error("\xff"), Catch::Contains("at offset 0 "));                   // outside a string
  // A byte-order mark is not part of JSON text (nlohmann would skip it).
  CHECK(parse_error("\xef\xbb\xbf{}") ==
        "input.json: malformed JSON at offset 0 (line 1, column 1): a byte-order mark is not allowed");
  // Control characters must be escaped.
  CHECK_THAT(parse_error("\"a\nb\""), Catch::Contains("at offset 2 ") && Catch::Contains("control character"));
  CHECK_THAT(parse_error(std::string("\"a\0b\"", 5)), Catch::Contains("control character"));
  CHECK_THAT(parse_error("\"\x1f\""), Catch::Contains("control character"));
}

TEST_CASE("strings that are not valid UTF-8 are written with U+FFFD, so the output parses back", "[json]") {
  // A state's metadata holds the data file's path, which need not be UTF-8.
  const std::string path = "/data/caf\xe9.txt";  // Latin-1 e-acute
  const std::string out = Json::string(path).dump();
  CHECK(out == "\"/data/caf\xef\xbf\xbd.txt\"");
  CHECK(Json::parse(out).as_string() == "/data/caf\xef\xbf\xbd.txt");
  Json obj = Json::object();
  obj.set("k\xff", Json::string("ok"));
  CHECK(Json::parse(obj.dump()).has("k\xef\xbf\xbd"));
  // Valid UTF-8 is written unchanged.
  CHECK(Json::string("\xc3\xa9").dump() == "\"\xc3\xa9\"");
}

TEST_CASE("numbers follow RFC 8259 and keep double precision", "[json]") {
  CHECK(Json::parse("0.1").as_number() == 0.1);
  CHECK(Json::parse("-1.5E+2").as_number() == -150.0);
  CHECK(Json::parse("1e-400").as_number() == 0.0);                          // underflow rounds to 0
  CHECK(Json::parse("4.9e-324").as_number() == std::ldexp(1.0, -1074));    // smallest subnormal
  CHECK(Json::parse("1.7976931348623157e308").as_number() == 1.7976931348623157e308);
  CHECK(Json::parse("9223372036854775808").as_number() == 9223372036854775808.0);  // past int64
  CHECK(Json::parse("-9223372036854775809").as_number() == -9223372036854775808.0);
  CHECK(Json::parse("18446744073709551616").as_number() == 18446744073709551616.0);  // past uint64
  CHECK(Json::parse("123456789012345678901234567890").as_number() == 1.2345678901234568e29);
  for (const char* bad : {"01", "-01", "1.", ".5", "+1", "-", "1e", "1e+", "0x10", "NaN", "Infinity", "-Infinity",
                          "1.5.2", "--1", "1_000"}) {
    INFO(bad);
    CHECK_THAT(parse_error(bad), Catch::Contains("malformed JSON at offset "));
  }
  // Out of a double's range is an error, not infinity.
  CHECK(parse_error("[1e400]") == "input.json: malformed JSON at offset 5 (line 1, column 6): number overflow "
                                  "parsing '1e400'");
  CHECK_THAT(parse_error("-1e309"), Catch::Contains("number overflow"));
}

TEST_CASE("as_int returns exact integers only", "[json]") {
  CHECK(Json::parse("0").as_int() == 0);
  CHECK(Json::parse("-0").as_int() == 0);
  CHECK(Json::parse("-42").as_int() == -42);
  CHECK(Json::parse("1.0").as_int() == 1);
  CHECK(Json::parse("1e2").as_int() == 100);
  CHECK(Json::parse("0.5e1").as_int() == 5);
  CHECK(Json::parse("123.4500e2").as_int() == 12345);
  CHECK(Json::parse("0.0e-5").as_int() == 0);
  CHECK(Json::parse("9007199254740991").as_int() == 9007199254740991);    // 2^53 - 1
  CHECK(Json::parse("-9007199254740991").as_int() == -9007199254740991);
  CHECK(Json::parse("[4294967296]").items()[0].as_int() == 4294967296);
  CHECK(Json::number(3.0).as_int() == 3);

  CHECK_THROWS_MATCHES(Json::parse("2.5").as_int(), IOError,
                       Catch::Message("JSON: expected an integer, got 2.5"));
  CHECK_THROWS_WITH(Json::parse("-0.1").as_int(), "JSON: expected an integer, got -0.1");
  // 2^53 and beyond are not all representable, so none is trusted.
  CHECK_THROWS_WITH(Json::parse("9007199254740992").as_int(),
                    "JSON: expected an integer below 2^53 in magnitude (larger ones are not exact), got "
                    "9007199254740992");
  CHECK_THROWS_WITH(Json::parse("9007199254740993").as_int(), Catch::Contains("below 2^53"));
  CHECK_THROWS_WITH(Json::parse("-9007199254740992").as_int(), Catch::Contains("below 2^53"));
  CHECK_THROWS_WITH(Json::parse("18446744073709551616").as_int(), Catch::Contains("below 2^53"));
  CHECK_THROWS_WITH(Json::parse("1e300").as_int(), Catch::Contains("below 2^53"));
  CHECK_THROWS_WITH(Json::number(1e16).as_int(), Catch::Contains("below 2^53"));
  CHECK_THROWS_WITH(Json::number(INFINITY).as_int(), Catch::Contains("below 2^53"));
  CHECK_THROWS_WITH(Json::number(NAN).as_int(), Catch::Contains("expected an integer"));
  // Text that is not exactly an integer, although its double is integral.
  CHECK(Json::parse("1.0000000000000000001").as_number() == 1.0);
  CHECK_THROWS_WITH(Json::parse("1.0000000000000000001").as_int(),
                    "JSON: expected an integer, got a number that only rounds to 1");
  CHECK_THROWS_WITH(Json::parse("9007199254740990.5").as_int(), Catch::Contains("only rounds to"));
  CHECK_THROWS_WITH(Json::parse("1e-400").as_int(), Catch::Contains("only rounds to 0"));
  CHECK_THROWS_WITH(Json::parse("[7, 5e-1]").items()[1].as_int(), Catch::Contains("got 0.5"));
}

TEST_CASE("typed access names the expected and actual type", "[json]") {
  const Json j = Json::parse(R"({"n":1,"s":"x","a":[]})");
  CHECK_THROWS_MATCHES(j.at("n").as_string(), IOError, Catch::Message("JSON: expected a string, got a number"));
  CHECK_THROWS_WITH(j.at("s").as_int(), "JSON: expected a number, got a string");
  CHECK_THROWS_WITH(j.at("a").members(), "JSON: expected a object, got a array");
  CHECK_THROWS_WITH(j.as_bool(), "JSON: expected a boolean, got a object");
  CHECK_THROWS_WITH(j.at("missing"), "JSON: missing key \"missing\"");
  CHECK_FALSE(j.at("a").has("n"));
  CHECK(j.has("n"));
}
