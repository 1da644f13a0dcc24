// The SentencePiece tokenizer on a tiny model trained here by the library's
// own trainer (no .model file is available offline): loading by file and by
// folder, vocab size and BOS/EOS from the model, no BOS/EOS added by encode,
// control pieces in the text recognised, round trips of normalized text, the
// hash of the file's bytes, the errors for a file that is not a model, and
// ids equal to the library's own encoding (between special pieces).
#include <catch2/catch.hpp>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/error.h"
#include "tests/tokenizer/tokenizer_test_util.h"
#include "tokenizer/sentencepiece.h"

using namespace remat;

namespace {

// A few KB of text and a unigram model of 120 pieces trained on it, once.
const std::string& model_dir() {
  static const std::string dir = [] {
    const std::string d = test::temp_dir("spm");
    std::ostringstream text;
    const char* words[] = {"the",   "quick", "brown", "fox",   "jumps", "over",  "lazy",   "dog",
                           "token", "model", "train", "piece", "memory", "engine", "tensor", "save"};
    for (int i = 0; i < 400; ++i) {
      for (int j = 0; j < 7; ++j) text << (j ? " " : "") << words[(i * 7 + j * 3 + i / 5) % 16];
      text << (i % 3 == 0 ? ".\n" : "\n");
    }
    test::write_all(d + "/train.txt", text.str());
    const std::unordered_map<std::string, std::string> args = {
        {"input", d + "/train.txt"},   {"model_prefix", d + "/tiny"}, {"vocab_size", "120"},
        {"model_type", "unigram"},     {"character_coverage", "1.0"}, {"hard_vocab_limit", "false"},
        {"num_threads", "1"},          {"minloglevel", "2"},          {"user_defined_symbols", "<sep>"}};
    const auto status = sentencepiece::SentencePieceTrainer::Train(args);
    INFO(status.ToString());
    REQUIRE(status.ok());
    return d;
  }();
  return dir;
}

}  // namespace

TEST_CASE("SentencePiece model trained here: load, sizes, encode and decode") {
  const std::string path = model_dir() + "/tiny.model";
  const auto tok = load_tokenizer(path);
  CHECK(tok->kind() == "sentencepiece");
  CHECK(tok->vocab_size() > 40);
  CHECK(tok->vocab_size() <= 120);
  CHECK(tok->bos_id() == std::optional<std::int32_t>(1));  // the trainer's defaults: unk 0, bos 1, eos 2
  CHECK(tok->eos_id() == std::optional<std::int32_t>(2));
  CHECK(tok->hash() == tokenizer_detail::xxh3_hex(test::read_all(path)));

  const std::string text = "the quick brown fox jumps over the lazy dog";
  const auto ids = tok->encode(text);
  REQUIRE(!ids.empty());
  for (auto id : ids) {
    CHECK(id > 2);  // no BOS/EOS added, nothing unknown
    CHECK(id < tok->vocab_size());
  }
  CHECK(tok->decode(ids) == text);
  CHECK(tok->encode("") == std::vector<std::int32_t>{});

  // Control pieces in the text map to their ids and decode as their text;
  // the user-defined <sep> is the library's.
  const auto with_specials = tok->encode("<s>the dog</s>");
  REQUIRE(with_specials.size() >= 3);
  CHECK(with_specials.front() == 1);
  CHECK(with_specials.back() == 2);
  CHECK(tok->decode(with_specials) == "<s>the dog</s>");
  const auto sep = tok->encode("fox<sep>dog");
  CHECK(std::count(sep.begin(), sep.end(), 3) == 1);  // <sep> is the first piece after the specials
  CHECK(tok->decode(sep) == "fox<sep>dog");

  CHECK_THROWS_WITH(tok->decode({static_cast<std::int32_t>(tok->vocab_size())}),
                    Catch::Contains("is not in the vocabulary"));
}

TEST_CASE("SentencePiece ids are the library's own: whole texts, and the runs between special pieces") {
  const std::string path = model_dir() + "/tiny.model";
  const auto tok = load_tokenizer(path);
  sentencepiece::SentencePieceProcessor lib;
  REQUIRE(lib.Load(path).ok());
  const auto lib_ids = [&](const std::string& text) {
    std::vector<int> ids;
    REQUIRE(lib.Encode(text, &ids).ok());
    return std::vector<std::int32_t>(ids.begin(), ids.end());
  };
  // Texts outside the training text too: unknown letters, digits, runs of
  // spaces, newlines, accents and CJK (byte fallback is off: unknown pieces).
  const std::vector<std::string> texts = {
      "the quick brown fox jumps over the lazy dog", "  leading and   inner   spaces ",
      "engine\ntensor\n\nsave", "Zebra 12345 quixotic!?", "caf\xc3\xa9 na\xc3\xafve \xe6\xbc\xa2\xe5\xad\x97",
      "memorymemory model-train piece_save", "x"};
  for (const std::string& text : texts) {
    INFO(text);
    const auto ids = tok->encode(text);
    CHECK(ids == lib_ids(text));
    // The library's decode, but for unknown pieces: remat writes them as
    // their piece text "<unk>" (encoded again to the same id), the library
    // as " \xe2\x81\x87 ".
    std::string decoded;
    for (std::size_t i = 0; i < ids.size();) {
      std::size_t j = i;
      while (j < ids.size() && !lib.IsUnknown(ids[j])) ++j;
      std::string part;
      std::vector<int> run(ids.begin() + std::ptrdiff_t(i), ids.begin() + std::ptrdiff_t(j));
      if (i > 0 && !run.empty()) run.insert(run.begin(), lib.PieceToId("e"));  // keep the run's leading space
      REQUIRE(lib.Decode(run, &part).ok());
      decoded += i > 0 && !run.empty() ? part.substr(1) : part;
      if (j < ids.size()) decoded += "<unk>";
      i = j + 1;
    }
    CHECK(tok->decode(ids) == decoded);
  }
  // Text around a control piece is encoded as runs of their own, each with
  // the library's dummy prefix and trimmed spaces, and decoded so.
  CHECK(tok->decode(tok->encode("the dog </s> over fox")) == "the dog</s>over fox");
  // Special pieces in the text: remat matches them itself (the library would
  // spell "<s>" as ordinary pieces) and encodes the runs between them with
  // the library.
  std::vector<std::int32_t> want = lib_ids("the dog ");
  want.push_back(2);
  const auto tail = lib_ids(" over fox");
  want.insert(want.end(), tail.begin(), tail.end());
  CHECK(tok->encode("the dog </s> over fox") == want);
  CHECK(lib_ids("</s>") != std::vector<std::int32_t>{2});
}

TEST_CASE("SentencePiece: a folder with tokenizer.model, and files that are not models") {
  const std::string dir = test::temp_dir("spm-dir");
  std::filesystem::copy_file(model_dir() + "/tiny.model", dir + "/tokenizer.model");
  const auto tok = load_tokenizer(dir);
  CHECK(tok->kind() == "sentencepiece");
  CHECK(tok->decode(tok->encode("lazy tensor engine")) == "lazy tensor engine");

  test::write_all(dir + "/broken.model", "this is not a protobuf");
  CHECK_THROWS_AS(load_tokenizer(dir + "/broken.model"), Error);
  CHECK_THROWS_WITH(load_tokenizer(dir + "/broken.model"),
                    Catch::Contains(dir + "/broken.model") && Catch::Contains("not a SentencePiece model"));
  CHECK_THROWS_AS(load_tokenizer(dir + "/absent.model"), IOError);
}
