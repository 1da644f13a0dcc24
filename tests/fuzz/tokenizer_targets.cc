// The tokenizer fuzz targets of targets.h: a Hugging Face tokenizer.json, and
// a tokenizer_config.json beside a fixed small tokenizer.json.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/json.h"
#include "tests/fuzz/invariant.h"
#include "tests/fuzz/targets.h"
#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"

namespace remat::fuzz {

namespace {

// A special id is unset or names a token that decodes.
void check_special(const char* target, const BpeTokenizer& t, std::optional<std::int32_t> id, const char* which) {
  if (!id) return;
  if (*id < 0 || *id >= t.vocab_size())
    broken(target, std::string(which) + " id " + std::to_string(*id) + " is outside [0, " +
                       std::to_string(t.vocab_size()) + ")");
  try {
    (void)t.decode({*id});
  } catch (const Error& e) {
    broken(target, std::string(which) + " id " + std::to_string(*id) + " does not decode: " + e.what());
  }
}

// encode(text) is stable, in range, and decodes to valid UTF-8. An Error
// from encode (a regex over PCRE2's match limit) is a rejection.
void check_encode(const char* target, const BpeTokenizer& t, std::string_view text) {
  std::vector<std::int32_t> ids;
  try {
    ids = t.encode(text);
  } catch (const Error&) {
    return;
  }
  for (auto id : ids)
    if (id < 0 || id >= t.vocab_size())
      broken(target, "encode gives id " + std::to_string(id) + " outside [0, " + std::to_string(t.vocab_size()) + ")");
  if (t.encode(text) != ids) broken(target, "encoding the same text twice gives different ids (the cache)");
  std::string back;
  try {
    back = t.decode(ids);
  } catch (const Error& e) {
    broken(target, std::string("an id that encode gave does not decode: ") + e.what());
  }
  if (!tokenizer_detail::valid_utf8(back)) broken(target, "decode gives invalid UTF-8");
}

void check_tokenizer(const char* target, const BpeTokenizer& t, std::string_view input) {
  if (t.vocab_size() < 0) broken(target, "negative vocab_size");
  check_special(target, t, t.eos_id(), "EOS");
  check_special(target, t, t.bos_id(), "BOS");
  for (const char* text : {"Hello, world! It's 2024.", "  na\xc3\xafve \t\n caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 ",
                           "bad \xff\xfe utf-8 \xe2\x82", "<|endoftext|><s>x</s> <|im_end|>"})
    check_encode(target, t, text);
  check_encode(target, t, input.substr(0, 512));
}

// GPT-2's byte-level character of byte b for printable ASCII: the byte
// itself, but space, which is U+0120 'Ġ' (the full table is in bpe_test.cc).
std::string byte_char(int b) { return b == ' ' ? std::string("\xc4\xa0") : std::string(1, char(b)); }

// The tokenizer.json of the tokenizer_config target: printable ASCII and
// space, two merges, and the special tokens EOS/BOS lookups know.
const std::string& base_tokenizer_json() {
  static const std::string text = [] {
    Json vocab = Json::object();
    int next = 0;
    for (int b = 32; b < 127; ++b) vocab.set(byte_char(b), Json::number(next++));
    vocab.set(byte_char(' ') + "t", Json::number(next++));
    vocab.set("he", Json::number(next++));
    Json merges = Json::array({Json::string(byte_char(' ') + " t"), Json::string("h e")});
    Json added = Json::array();
    int id = 100;
    for (const char* content : {"<|endoftext|>", "<|begin_of_text|>", "<s>", "</s>", "<|im_end|>", "<pad>"}) {
      Json t = Json::object();
      t.set("id", Json::number(id++));
      t.set("content", Json::string(content));
      t.set("special", Json::boolean(true));
      added.push(t);
    }
    Json model = Json::object();
    model.set("type", Json::string("BPE"));
    model.set("vocab", vocab);
    model.set("merges", merges);
    Json pre = Json::object();
    pre.set("type", Json::string("ByteLevel"));
    Json root = Json::object();
    root.set("model", model);
    root.set("added_tokens", added);
    root.set("pre_tokenizer", pre);
    return root.dump();
  }();
  return text;
}

}  // namespace

bool tokenizer(std::string_view input) {
  std::unique_ptr<BpeTokenizer> t;
  try {
    t = BpeTokenizer::from_json(std::string(input), std::nullopt, "fuzz tokenizer.json");
  } catch (const Error&) {
    return false;
  }
  check_tokenizer("tokenizer", *t, input);
  return true;
}

bool tokenizer_config(std::string_view input) {
  std::unique_ptr<BpeTokenizer> t;
  try {
    t = BpeTokenizer::from_json(base_tokenizer_json(), std::string(input), "fuzz tokenizer.json");
  } catch (const Error&) {
    return false;
  }
  check_special("tokenizer_config", *t, t->eos_id(), "EOS");
  check_special("tokenizer_config", *t, t->bos_id(), "BOS");
  check_encode("tokenizer_config", *t, "<s>hello</s>");
  return true;
}

}  // namespace remat::fuzz
