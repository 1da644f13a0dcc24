// Replays every committed fuzz input through its target (targets.h): the
// seed corpus (tests/fuzz/corpus/<target>/) and the inputs of past findings
// (tests/fuzz/crashes/<target>/), so the normal suite keeps each fixed
// finding fixed without clang. Run from the repository root (tools/run_tests.sh
// does). The regression cases below state what each past finding must give
// now.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/plan.h"
#include "engine/error.h"
#include "engine/json.h"
#include "models/config.h"
#include "models/hf_config.h"
#include "tests/fuzz/targets.h"
#include "tokenizer/bpe.h"
#include "train/safetensors.h"
#include "train/token_shards.h"

namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<fs::path> inputs_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("every committed fuzz input replays through its target without a finding") {
  REQUIRE(remat::fuzz::targets().size() == 10);
  for (const auto& t : remat::fuzz::targets()) {
    const auto seeds = inputs_in(fs::path("tests/fuzz/corpus") / t.name);
    INFO("target " << t.name << " (run from the repository root)");
    CHECK(seeds.size() >= 3);
    auto all = seeds;
    for (const auto& p : inputs_in(fs::path("tests/fuzz/crashes") / t.name)) all.push_back(p);
    int accepted = 0;
    for (const auto& p : all) {
      const std::string bytes = read_all(p);
      INFO("input " << p.string() << " (" << bytes.size() << " bytes)");
      bool ok = false;
      CHECK_NOTHROW(ok = t.run(bytes));
      accepted += ok;
    }
    // The seeds reach past the first checks: most are valid inputs.
    CHECK(accepted >= 3);
  }
}

TEST_CASE("the safetensors seeds with checksums are accepted (they exercise the verification)") {
  for (const char* name : {"checksummed.safetensors", "checksummed_one.safetensors", "mixed.safetensors"}) {
    INFO(name);
    CHECK(remat::fuzz::safetensors(read_all(fs::path("tests/fuzz/corpus/safetensors") / name)));
  }
  // One flipped data byte in a checksummed seed: rejected with a typed error.
  std::string bytes = read_all("tests/fuzz/corpus/safetensors/checksummed_one.safetensors");
  REQUIRE(bytes.size() > 4);
  bytes[bytes.size() - 2] ^= 0x10;
  CHECK_FALSE(remat::fuzz::safetensors(bytes));
}

// Found by the plan target: a block number past int64 escaped as
// std::out_of_range from std::stoll instead of a remat::Error.
TEST_CASE("recompute plan: a block number too large for int64 is a typed error naming it") {
  for (const std::string spec : {"block:8777777777777777777777777", "uniform:99999999999999999999",
                                 "selected:0,18446744073709551616", "per_block+selected:92233720368547758070"}) {
    INFO(spec);
    CHECK_THROWS_AS(remat::RecomputePlan::parse(spec, 4), remat::Error);
    CHECK_THROWS_WITH(remat::RecomputePlan::parse(spec, 4), Catch::Contains("is too large") && Catch::Contains(spec));
  }
  // The largest int64 still parses as a number (and is then out of range).
  CHECK_THROWS_WITH(remat::RecomputePlan::parse("block:9223372036854775807", 4), Catch::Contains("block:N needs N <= 4"));
}

// Found by the config target: non-finite values (JSON 1e999 read as inf by
// the first parser) were accepted, and the state's saved config (JSON has no
// inf) then failed to load back on resume. Values that make the model NaN
// are refused too.
TEST_CASE("model config: float fields must be finite and in range") {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<std::function<void(remat::ModelConfig&)>, std::string>> non_finite = {
      {[&](auto& c) { c.norm_eps = inf; }, "norm_eps must be finite and >= 0, got inf"},
      {[&](auto& c) { c.rope_theta = -inf; }, "rope_theta must be finite and > 0, got -inf"},
      {[&](auto& c) { c.init_std = std::nan(""); }, "init_std must be finite and >= 0, got nan"},
      {[&](auto& c) { c.aux_coef = inf; }, "aux_coef must be finite and >= 0, got inf"},
      {[&](auto& c) { c.z_coef = std::nan(""); }, "z_coef must be finite and >= 0, got nan"},
  };
  for (const auto& [set, why] : non_finite) {
    INFO(why);
    auto c = remat::ModelConfig::named("tiny");
    set(c);
    CHECK_THROWS_WITH(c.validate(), Catch::Contains(why) && Catch::Contains("invalid config 'tiny'"));
  }
  auto moe = remat::ModelConfig::named("tiny-moe");
  moe.capacity_factor = inf;
  CHECK_THROWS_WITH(moe.validate(), Catch::Contains("capacity_factor must be finite and >= 0"));

  const std::vector<std::pair<std::string, std::string>> out_of_range = {
      {R"({"rope_theta": 0})", "rope_theta must be finite and > 0, got 0"},
      {R"({"init_std": -0.5})", "init_std must be finite and >= 0, got -0.5"},
      {R"({"norm_eps": -1e-5})", "norm_eps must be finite and >= 0, got -1e-05"},
      {R"({"z_coef": -1})", "z_coef must be finite and >= 0, got -1"},
  };
  for (const auto& [text, why] : out_of_range) {
    INFO(text);
    CHECK_THROWS_AS(remat::ModelConfig::from_json(remat::Json::parse(text)), remat::Error);
    CHECK_THROWS_WITH(remat::ModelConfig::from_json(remat::Json::parse(text)), Catch::Contains(why));
  }
  // In range: accepted, and the written config loads back equal.
  const auto c = remat::ModelConfig::from_json(remat::Json::parse(R"({"norm_eps": 0, "z_coef": 0.001})"));
  CHECK(remat::ModelConfig::from_json(remat::Json::parse(c.to_json().dump())).to_json().dump() == c.to_json().dump());
}

// The targets above compare each serialisation with its own round trip, which
// a writer that changed its text both ways would still pass: these pin the
// text itself for one input of each.
TEST_CASE("pinned serialisations: a config's to_json, JSON dump, plan str and a saved safetensors header") {
  // A config's to_json: keys sorted, integers without a point, doubles to 17
  // significant digits (0.1 and 1e-5 are not exact in binary).
  const auto c = remat::ModelConfig::from_json(
      remat::Json::parse(R"({"name": "tiny-moe", "dropout": 0.1, "z_coef": 0.001, "capacity_factor": 0.75})"));
  CHECK(c.to_json().dump() ==
        R"({"aux_coef":0.01,"batch":8,"capacity_factor":0.75,"d_model":128,"dense_first":1,)"
        R"("dropout":0.10000000000000001,"experts":8,"ffn":344,"init_std":0.02,"moe_ffn":128,"n_heads":4,)"
        R"("n_layers":4,"name":"tiny-moe","norm_eps":1.0000000000000001e-05,"random_routing":false,)"
        R"("rope_theta":10000,"seq":128,"shared":1,"top_k":2,"vocab":256,"z_coef":0.001})");
  // The json target's seeds, dumped.
  CHECK(remat::Json::parse(read_all("tests/fuzz/corpus/json/scalars.json")).dump() == R"([null,true,false,0,-0,1.5000000000000001e-300,25000000000,-1.2345678901234568e+17,"x"])");
  CHECK(remat::Json::parse(read_all("tests/fuzz/corpus/json/strings.json")).dump() == R"({"esc":"a\"b\\c/d\u0008\u000c\n\r\t","u":"Aé€","utf8":"é€"})");
  CHECK(remat::Json::parse(read_all("tests/fuzz/corpus/json/nested.json")).dump() == R"({"a":[[[{"b":[1,{"c":{}}]}]]],"d":[]})");
  // The plan target's seeds, as canonical strings (4 blocks).
  const std::vector<std::pair<std::string, std::string>> plans = {
      {"none", "none"}, {"per_block", "per_block"}, {"selected:0,2", "per_block@0+per_block@2"}, {"uniform:2", "chunk@0-1+chunk@2-3"},
      {"block:2", "per_block@0-1"}, {"selected:1+block:1", "per_block@0-1"}, {"per_block+keep_last", "per_block@0-2"},
      {"selective:mlp,layernorm", "selective:layernorm+selective:mlp"}, {"attention+selective:mlp", "attention+selective:mlp"},
      {"selective:save_ops=matmul/scaled_dot_product_attention", "selective:save_ops=matmul/scaled_dot_product_attention"},
      {"per_block@0-1+offload:mlp@2-3+compress:fp8", "per_block@0-1+offload:mlp@2-3+compress:fp8"},
      {"per_block:reentrant", "per_block:reentrant"}, {"uniform:2:reentrant@0-3", "chunk:reentrant@0-1+chunk:reentrant@2-3"}};
  for (const auto& [spec, canonical] : plans) {
    INFO(spec);
    CHECK(remat::RecomputePlan::parse(spec, 4).str() == canonical);
    CHECK(remat::RecomputePlan::parse(canonical, 4).str() == canonical);
  }
  // The safetensors target's f32 seed, saved again: the header's exact text
  // (with remat's checksums) and the data after it.
  const remat::SafetensorsFile f32 = remat::load_safetensors("tests/fuzz/corpus/safetensors/f32.safetensors");
  const std::string bytes = remat::encode_safetensors({f32.tensors.begin(), f32.tensors.end()}, f32.metadata);
  REQUIRE(bytes.size() > 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[std::size_t(i)]);
  REQUIRE(bytes.size() == 8 + n + 24);
  CHECK(bytes.substr(8, n) == R"({"__metadata__":{"checksum_algorithm":"xxh3-64","checksums":"{\"w\":\"a6e707ccf7703447\"}"},)"
            R"("w":{"data_offsets":[0,24],"dtype":"F32","shape":[2,3]}}    )");
  CHECK(bytes.substr(8 + n) == read_all("tests/fuzz/corpus/safetensors/f32.safetensors").substr(8 + 64));
}

namespace {

// A shard header (train/token_shards.h) followed by `tail`.
std::string shard_bytes(std::uint32_t width, std::uint64_t count, std::uint64_t vocab, std::int64_t eos,
                        const std::string& tail = "") {
  std::string h = "RMTOKEN1";
  auto put = [&](std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) h.push_back(char((v >> (8 * i)) & 0xff));
  };
  put(width, 4);
  put(0, 4);
  put(count, 8);
  put(vocab, 8);
  h += "0123456789abcdef";
  put(std::uint64_t(eos), 8);
  put(1, 8);
  return h + tail;
}

}  // namespace

// Found by the token_shard target: the header's EOS id and vocabulary were
// not checked (EOS 3833745473465810943 with a vocabulary of 65536 loaded),
// and, found while writing it, a token count whose byte size passes 2^64
// wrapped around and matched a tiny file (2^62 + 1 tokens in 68 bytes: the
// reader then read far past the mapping).
TEST_CASE("token shard header: count, vocabulary and EOS are checked, naming the file") {
  const std::string two(2, '\0');
  CHECK(remat::parse_shard_header(shard_bytes(2, 1, 1000, -1, two), 66, "a.tok").count == 1);
  CHECK(remat::parse_shard_header(shard_bytes(2, 1, 1000, 999, two), 66, "a.tok").eos == 999);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {shard_bytes(4, (std::uint64_t(1) << 62) + 1, 1000, -1, std::string(4, '\0')),
       "--data: a.tok is 68 bytes but its header says 4611686018427387905 tokens of 4 bytes (over 2^64 bytes with "
       "the header): truncated or not a shard"},
      {shard_bytes(2, std::uint64_t(1) << 63, 1000, -1),
       "--data: a.tok is 64 bytes but its header says 9223372036854775808 tokens of 2 bytes (over 2^64 bytes"},
      {shard_bytes(2, 1, 0, -1, two), "--data: a.tok has vocabulary 0 in its header (expected 1 .. 2^32)"},
      {shard_bytes(4, 1, (std::uint64_t(1) << 32) + 1, -1, std::string(4, '\0')),
       "has vocabulary 4294967297 in its header (expected 1 .. 2^32)"},
      {shard_bytes(2, 1, 1000, 1000, two),
       "--data: a.tok has EOS id 1000 in its header, outside its vocabulary of 1000 (expected -1 or 0 .. 999)"},
      {shard_bytes(2, 1, 1000, -2, two), "has EOS id -2 in its header"},
  };
  for (const auto& [bytes, why] : bad) {
    INFO(why);
    CHECK_THROWS_AS(remat::parse_shard_header(bytes, bytes.size(), "a.tok"), remat::IOError);
    CHECK_THROWS_WITH(remat::parse_shard_header(bytes, bytes.size(), "a.tok"), Catch::Contains(why));
  }
}

// Found while writing the tokenizer target (reproduced by its binary: ASan's
// out-of-memory): the loader keeps a table indexed by token id, and one id of
// 2000000000 made it allocate 64 GB. Ids must now be below 2^22.
TEST_CASE("tokenizer.json: ids past 2^22 are an error naming the field, before any allocation") {
  const std::string head = R"({"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "merges": [], "vocab": )";
  CHECK_THROWS_WITH(remat::BpeTokenizer::from_json(head + R"({"a": 2000000000}}})", std::nullopt, "t.json"),
                    Catch::Contains("t.json: model.vocab[\"a\"]: id 2000000000 out of range (ids are 0 .. 4194303)"));
  CHECK_THROWS_WITH(
      remat::BpeTokenizer::from_json(
          head + R"({"a": 0}}, "added_tokens": [{"id": 4194304, "content": "<x>"}]})", std::nullopt, "t.json"),
      Catch::Contains("t.json: added_tokens[0].id: 4194304 out of range (ids are 0 .. 4194303)"));
  const auto t = remat::BpeTokenizer::from_json(
      head + R"({"a": 0}}, "added_tokens": [{"id": 4194303, "content": "<x>"}]})", std::nullopt, "t.json");
  CHECK(t->vocab_size() == 4194304);
  CHECK(t->encode("a<x>") == std::vector<std::int32_t>{0, 4194303});
}

// Found by the hf_config target: a Mixtral config.json with
// "num_local_experts": 0 imported as a dense model that export then refused
// ("this model is not a Mixtral"). Import now rejects it, naming the key.
TEST_CASE("hf config: a Mixtral without experts is an error naming num_local_experts") {
  const std::string text = R"({"architectures": ["MixtralForCausalLM"], "vocab_size": 320, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_local_experts": )";
  for (const char* n : {"0", "-3"}) {
    INFO(n);
    CHECK_THROWS_AS(remat::config_from_hf(remat::Json::parse(text + n + "}"), "m/config.json"), remat::Error);
    CHECK_THROWS_WITH(remat::config_from_hf(remat::Json::parse(text + n + "}"), "m/config.json"),
                      Catch::Contains(std::string("m/config.json: \"num_local_experts\": ") + n +
                                      " is not supported (a Mixtral routes every block through its experts: at least 1)"));
  }
  const remat::HfConfig one = remat::config_from_hf(remat::Json::parse(text + "1, \"num_experts_per_tok\": 1}"));
  CHECK(one.config.experts == 1);
  CHECK(remat::config_to_hf(one.config, "float32").at("num_local_experts").as_int() == 1);
}
