// The byte-level BPE tokenizer on small tokenizer.json files written here:
// merges by rank with the leftmost pair first, both merge forms, ignore_merges,
// GPT-2's ByteLevel regex, added tokens (lstrip/rstrip/single_word), EOS/BOS
// from tokenizer_config.json or well-known tokens; WHATWG replacement of
// invalid UTF-8; and the loader's errors, naming the path and what was
// expected.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/json.h"
#include "tests/tokenizer/tokenizer_test_util.h"
#include "tokenizer/bpe.h"

using namespace remat;

namespace {

// GPT-2's byte-level character for byte b, as UTF-8.
std::string byte_char(int b) {
  auto printable = [](int x) { return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174; };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int x = 0; x < b; ++x)
      if (!printable(x)) ++cp;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

std::string byte_level(const std::string& raw) {
  std::string s;
  for (unsigned char c : raw) s += byte_char(c);
  return s;
}

struct Spec {
  std::vector<std::pair<std::string, std::string>> merges;  // raw text pairs
  bool pairs_as_arrays = false;
  bool ignore_merges = false;
  std::vector<std::string> extra_vocab;  // raw texts with their own ids
  std::string pre_tokenizer = R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})";
  std::string added_tokens = "[]";
  std::string normalizer = "null";
  std::string model_type = "BPE";
};

// A tokenizer.json: ids 0..255 are the bytes, then each merge's result in
// order, then extra_vocab.
std::string tokenizer_json(const Spec& spec) {
  Json vocab = Json::object();
  int next = 0;
  for (int b = 0; b < 256; ++b) vocab.set(byte_char(b), Json::number(next++));
  Json merges = Json::array();
  for (const auto& [a, b] : spec.merges) {
    const std::string merged = byte_level(a + b);
    if (!vocab.has(merged)) vocab.set(merged, Json::number(next++));
    if (spec.pairs_as_arrays)
      merges.push(Json::array({Json::string(byte_level(a)), Json::string(byte_level(b))}));
    else
      merges.push(Json::string(byte_level(a) + " " + byte_level(b)));
  }
  for (const auto& t : spec.extra_vocab)
    if (!vocab.has(byte_level(t))) vocab.set(byte_level(t), Json::number(next++));
  return std::string("{\"version\": \"1.0\", \"added_tokens\": ") + spec.added_tokens +
         ", \"normalizer\": " + spec.normalizer + ", \"pre_tokenizer\": " + spec.pre_tokenizer +
         ", \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"" + spec.model_type +
         "\", \"dropout\": null, \"ignore_merges\": " + (spec.ignore_merges ? "true" : "false") +
         ", \"vocab\": " + vocab.dump() + ", \"merges\": " + merges.dump() + "}}";
}

std::unique_ptr<BpeTokenizer> make(const Spec& spec, const std::optional<std::string>& config = std::nullopt) {
  return BpeTokenizer::from_json(tokenizer_json(spec), config, "test tokenizer.json");
}

std::int32_t id(const BpeTokenizer& t, const std::string& raw) {
  const auto i = t.token_id(byte_level(raw));
  REQUIRE(i.has_value());
  return *i;
}

}  // namespace

TEST_CASE("Merges apply by rank, the leftmost pair first among equals") {
  Spec spec;
  spec.merges = {{"b", "c"}, {"a", "b"}, {"a", "a"}, {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}};
  for (bool arrays : {false, true}) {
    spec.pairs_as_arrays = arrays;
    const auto t = make(spec);
    CHECK(t->encode("abc") == std::vector<std::int32_t>{'a', id(*t, "bc")});  // "b c" has the lower rank
    CHECK(t->encode("ab") == std::vector<std::int32_t>{id(*t, "ab")});
    CHECK(t->encode("aaa") == std::vector<std::int32_t>{id(*t, "aa"), 'a'});  // leftmost first
    CHECK(t->encode("hello") == std::vector<std::int32_t>{id(*t, "hello")});
    // GPT-2's regex splits " hello" and " world"; " " has no merge with "h".
    CHECK(t->encode("hello hello") == std::vector<std::int32_t>{id(*t, "hello"), ' ', id(*t, "hello")});
    CHECK(t->decode(t->encode("hello abc aaa")) == "hello abc aaa");
  }
}

TEST_CASE("ignore_merges maps a whole pre-token in the vocab to its id") {
  Spec spec;
  spec.merges = {{"a", "b"}};
  spec.extra_vocab = {"abc"};
  const auto plain = make(spec);
  CHECK(plain->encode("abc") == std::vector<std::int32_t>{id(*plain, "ab"), 'c'});
  spec.ignore_merges = true;
  const auto ignoring = make(spec);
  CHECK(ignoring->encode("abc") == std::vector<std::int32_t>{id(*ignoring, "abc")});
  CHECK(ignoring->encode("abcab") == std::vector<std::int32_t>{id(*ignoring, "ab"), 'c', id(*ignoring, "ab")});
}

TEST_CASE("Split pre-tokenizer with White_Space as Oniguruma has it") {
  Spec spec;
  spec.pre_tokenizer = R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\s+|\\S+"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})";
  spec.merges = {{"x", "x"}, {" ", " "}, {"\xC2", "\x85"}};
  const auto t = make(spec);
  CHECK(t->encode("xx  xx") == std::vector<std::int32_t>{id(*t, "xx"), id(*t, "  "), id(*t, "xx")});
  // U+0085 is White_Space: it is split from the x's (not merged into them).
  CHECK(t->encode("xx\xC2\x85xx") == std::vector<std::int32_t>{id(*t, "xx"), id(*t, "\xC2\x85"), id(*t, "xx")});
}

TEST_CASE("Added tokens: leftmost-longest, lstrip, rstrip and single_word") {
  Spec spec;
  spec.added_tokens = R"([
    {"id": 1000, "content": "<|a|>", "special": true, "normalized": false},
    {"id": 1001, "content": "<|a|><|b|>", "special": true, "normalized": false},
    {"id": 1002, "content": "<mask>", "special": true, "lstrip": true, "rstrip": true, "normalized": false},
    {"id": 1003, "content": "cat", "special": false, "single_word": true, "normalized": true},
    {"id": 1004, "content": "</s>", "special": true}])";
  const auto t = make(spec);
  CHECK(t->vocab_size() == 1005);
  CHECK(t->encode("x<|a|><|b|>y") == std::vector<std::int32_t>{'x', 1001, 'y'});
  CHECK(t->encode("<|a|><|a|>") == std::vector<std::int32_t>{1000, 1000});
  CHECK(t->encode("a  <mask>  b") == std::vector<std::int32_t>{'a', 1002, 'b'});
  CHECK(t->encode("cat") == std::vector<std::int32_t>{1003});
  CHECK(t->encode("a cat.") == std::vector<std::int32_t>{'a', ' ', 1003, '.'});
  CHECK(t->encode("cats") == std::vector<std::int32_t>{'c', 'a', 't', 's'});  // not a single word
  CHECK(t->decode({'x', 1001, 1004}) == "x<|a|><|b|></s>");
  CHECK(t->eos_id() == std::optional<std::int32_t>(1004));  // well-known </s>
  CHECK(t->bos_id() == std::nullopt);
  // tokenizer_config.json wins; {"content": ...} and null are accepted.
  const auto configured = make(spec, R"({"eos_token": {"content": "<|a|>"}, "bos_token": null})");
  CHECK(configured->eos_id() == std::optional<std::int32_t>(1000));
  CHECK(configured->bos_id() == std::nullopt);
  CHECK_THROWS_WITH(make(spec, R"({"eos_token": "<nope>"})"),
                    Catch::Contains("eos_token \"<nope>\" is not a token of test tokenizer.json"));
}

TEST_CASE("NFC normalizer composes before merging") {
  Spec spec;
  spec.normalizer = R"({"type": "NFC"})";
  spec.merges = {{"\xC3", "\xA9"}};  // é
  const auto t = make(spec);
  CHECK(t->encode("e\xCC\x81") == std::vector<std::int32_t>{id(*t, "\xC3\xA9")});
  CHECK(t->encode("\xC3\xA9") == std::vector<std::int32_t>{id(*t, "\xC3\xA9")});
  CHECK(t->decode(t->encode("cafe\xCC\x81")) == "caf\xC3\xA9");
}

TEST_CASE("Invalid UTF-8 is replaced as WHATWG's TextDecoder does") {
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(replace_invalid_utf8("") == "");
  CHECK(replace_invalid_utf8("plain ascii") == "plain ascii");
  CHECK(replace_invalid_utf8("\xC3\xA9\xF0\x9F\x98\x80") == "\xC3\xA9\xF0\x9F\x98\x80");
  CHECK(replace_invalid_utf8("\xFF") == fffd);
  CHECK(replace_invalid_utf8("\xC3") == fffd);
  CHECK(replace_invalid_utf8("\xE2\x82") == fffd);                       // truncated: one
  CHECK(replace_invalid_utf8("\xED\xA0\x80") == fffd + fffd + fffd);     // a surrogate: three
  CHECK(replace_invalid_utf8("\xE0\x80\x41") == fffd + fffd + "A");      // overlong lead, then 0x80
  CHECK(replace_invalid_utf8("\xF4\x90\x80\x80") == fffd + fffd + fffd + fffd);  // above U+10FFFF
  CHECK(replace_invalid_utf8("\xC0\xAF") == fffd + fffd);
  CHECK(replace_invalid_utf8("\xC3\xA9\xC3") == "\xC3\xA9" + fffd);
  CHECK(replace_invalid_utf8("a\xF0\x9F\x98z") == "a" + fffd + "z");
  CHECK(tokenizer_detail::valid_utf8("\xC3\xA9"));
  CHECK_FALSE(tokenizer_detail::valid_utf8("\xC3"));

  Spec spec;
  const auto t = make(spec);
  CHECK(t->encode("a\xFF") == t->encode("a" + fffd));
  CHECK(t->decode({0xC3}) == fffd);  // half a character
}

TEST_CASE("Errors name the path and what was expected") {
  const std::string dir = test::temp_dir("tokenizer");
  CHECK_THROWS_AS(load_tokenizer(dir + "/missing.json"), IOError);
  CHECK_THROWS_WITH(load_tokenizer(dir + "/missing.json"),
                    Catch::Contains(dir + "/missing.json") && Catch::Contains("no such file or directory"));
  CHECK_THROWS_WITH(load_tokenizer(dir), Catch::Contains(dir) && Catch::Contains("neither tokenizer.json nor tokenizer.model"));
  test::write_all(dir + "/vocab.txt", "a\n");
  CHECK_THROWS_WITH(load_tokenizer(dir + "/vocab.txt"), Catch::Contains("not a tokenizer file"));

  Spec spec;
  spec.model_type = "WordPiece";
  test::write_all(dir + "/tokenizer.json", tokenizer_json(spec));
  CHECK_THROWS_AS(load_tokenizer(dir), Error);
  CHECK_THROWS_WITH(load_tokenizer(dir), Catch::Contains(dir + "/tokenizer.json") &&
                                             Catch::Contains("model.type is \"WordPiece\"; only \"BPE\" is supported"));
  test::write_all(dir + "/tokenizer.json", "{\"model\": ");
  CHECK_THROWS_AS(load_tokenizer(dir + "/tokenizer.json"), IOError);

  Spec lowercase;
  lowercase.normalizer = R"({"type": "Lowercase"})";
  CHECK_THROWS_WITH(make(lowercase), Catch::Contains("normalizer.type \"Lowercase\" is not supported"));
  Spec prefix;
  prefix.pre_tokenizer = R"({"type": "ByteLevel", "add_prefix_space": true})";
  CHECK_THROWS_WITH(make(prefix), Catch::Contains("add_prefix_space true is not supported"));
  Spec metaspace;
  metaspace.pre_tokenizer = R"({"type": "Metaspace"})";
  CHECK_THROWS_WITH(make(metaspace), Catch::Contains("pre_tokenizer.type \"Metaspace\" is not supported"));
  Spec bad_regex;
  bad_regex.pre_tokenizer = R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})";
  CHECK_THROWS_WITH(make(bad_regex), Catch::Contains("regex \"(unclosed\" does not compile"));
  Spec removed;
  removed.pre_tokenizer = R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})";
  CHECK_THROWS_WITH(make(removed), Catch::Contains("behavior \"Removed\" is not supported"));
  const std::string bad_merge = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]},
      "pre_tokenizer": {"type": "ByteLevel"}})";
  CHECK_THROWS_WITH(BpeTokenizer::from_json(bad_merge, std::nullopt, "x.json"),
                    Catch::Contains("x.json: model.merges[0]") && Catch::Contains("ab is not in the vocab"));
}
