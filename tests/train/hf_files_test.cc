// SafetensorsReader (a tensor at a time) and Hugging Face checkpoint folders
// (CheckpointFiles, save_hf_checkpoint).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/json.h"
#include "engine/memory_poison.h"
#include "tests/files.h"
#include "train/hf_files.h"
#include "train/safetensors.h"

using namespace remat;

namespace {

namespace fs = std::filesystem;
using test::read_all;
using test::write_all;

std::string temp_dir() { return test::temp_dir("hf"); }

// Same dtype, sizes and bytes.
bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

// A 1-D tensor of dtype `t` (2 bytes an element) holding every 16-bit pattern.
Tensor all_bit_patterns(DType t) {
  Tensor x = empty({65536}, t);
  auto* p = static_cast<std::uint16_t*>(x.raw_data());
  for (std::uint32_t i = 0; i < 65536; ++i) p[i] = std::uint16_t(i);
  return x;
}

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The byte offset of tensor `name`'s data in a safetensors file's bytes.
std::size_t data_offset(const std::string& bytes, const std::string& name) {
  std::uint64_t n = 0;
  for (int k = 0; k < 8; ++k) n |= std::uint64_t(static_cast<unsigned char>(bytes[std::size_t(k)])) << (8 * k);
  const Json header = Json::parse(bytes.substr(8, n));
  return std::size_t(8 + n + std::uint64_t(header.at(name).at("data_offsets").items()[0].as_int()));
}

// A safetensors file from a header object (no checksums), its data section
// left as a hole of `data_bytes` zero bytes (a sparse file: no memory, no disk).
void write_sparse(const std::string& path, const Json& header, std::uint64_t data_bytes) {
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h += ' ';
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes += char((std::uint64_t(h.size()) >> (8 * i)) & 0xff);
  write_all(path, bytes + h);
  fs::resize_file(path, 8 + h.size() + data_bytes);
}

Json entry(const char* dtype, const Shape& shape, std::uint64_t begin, std::uint64_t end) {
  Json s = Json::array();
  for (auto v : shape) s.push(Json::number(double(v)));
  Json e = Json::object();
  e.set("dtype", Json::string(dtype));
  e.set("shape", s);
  e.set("data_offsets", Json::array({Json::number(double(begin)), Json::number(double(end))}));
  return e;
}

std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// "VmHWM" or "VmRSS" of this process in bytes.
std::int64_t proc_status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return -1;
}

// Resets the peak RSS to the current RSS (Linux: clear_refs 5); false where
// the kernel does not allow it.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return out.good();
}

constexpr std::int64_t kMiB = 1 << 20;

}  // namespace

TEST_CASE("SafetensorsReader reads single tensors equal to load_safetensors'", "[hf][reader]") {
  const std::string dir = temp_dir();
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"w", randn({7, 5})},
      {"wt", randn({4, 6}).t()},
      {"ids", from_vector<std::int64_t>({3, -1, 7})},
      {"half", randn({9}).to(DType::bf16)},
      {"h16", randn({2, 3}).to(DType::f16)},
      {"scalar", full({}, 2.5)},
      {"empty", zeros({0, 4})},
  };
  for (const bool sums : {true, false}) {
    INFO("checksums " << sums);
    const std::string path = dir + "/a" + std::to_string(sums) + ".safetensors";
    save_safetensors(path, tensors, {{"step", "4"}}, {.checksums = sums});
    const SafetensorsFile whole = load_safetensors(path);
    SafetensorsReader r(path);
    CHECK(r.path() == path);
    CHECK(r.checksummed() == sums);
    CHECK(r.metadata() == std::map<std::string, std::string>{{"step", "4"}});
    CHECK(r.names() == std::vector<std::string>{"empty", "h16", "half", "ids", "scalar", "w", "wt"});
    CHECK(r.has("w"));
    CHECK_FALSE(r.has("nope"));
    CHECK(r.dtype("half") == DType::bf16);
    CHECK(r.shape("wt") == Shape{6, 4});
    CHECK(r.nbytes("w") == 7 * 5 * 4);
    CHECK(r.nbytes("empty") == 0);
    for (const auto& [name, t] : tensors) {
      INFO(name);
      const Tensor got = r.read(name);
      CHECK(got.device().is_cpu());
      CHECK(same_bits(got, whole.tensors.at(name)));
      CHECK(same_bits(got, t));
      CHECK(r.read(name, t.dtype()).dtype() == t.dtype());  // as = the stored dtype: no conversion
    }
    CHECK_THROWS_AS(r.read("nope"), IOError);
    CHECK_THROWS_WITH(r.read("nope"), Catch::Contains(path) && Catch::Contains("'nope'"));
    CHECK_THROWS_WITH(r.shape("nope"), Catch::Contains(path) && Catch::Contains("'nope'"));
    // Movable: the file stays open with the new owner.
    SafetensorsReader moved = std::move(r);
    CHECK(same_bits(moved.read("w"), tensors[0].second));
  }
}

TEST_CASE("SafetensorsReader widens bf16 and f16 to f32 exactly, every bit pattern", "[hf][reader]") {
  const std::string dir = temp_dir(), path = dir + "/a.safetensors";
  const Tensor b = all_bit_patterns(DType::bf16), h = all_bit_patterns(DType::f16);
  const Tensor f = randn({3, 11});
  save_safetensors(path, {{"b", b}, {"h", h}, {"f", f}, {"ids", from_vector<std::int32_t>({1, 2})}});
  SafetensorsReader r(path);
  const Tensor bf = r.read("b", DType::f32), hf = r.read("h", DType::f32);
  REQUIRE(bf.dtype() == DType::f32);
  REQUIRE(hf.dtype() == DType::f32);
  CHECK(bf.sizes() == Shape{65536});
  const auto* bp = static_cast<const float*>(bf.raw_data());
  const auto* hp = static_cast<const float*>(hf.raw_data());
  std::int64_t bad_b = 0, bad_h = 0;
  for (std::uint32_t i = 0; i < 65536; ++i) {
    if (bits_of(bp[i]) != i << 16) ++bad_b;  // bf16 is the top half of an f32
    const float want = f16::to_float(std::uint16_t(i));
    if (bits_of(hp[i]) != bits_of(want)) ++bad_h;
  }
  CHECK(bad_b == 0);
  CHECK(bad_h == 0);
  // The engine's own cast agrees bit for bit (NaNs included).
  CHECK(same_bits(hf, h.to(DType::f32)));
  CHECK(same_bits(r.read("f", DType::f32), f));  // f32 as f32: the bytes as stored
  // Narrowing casts round to nearest even, like Tensor::to.
  CHECK(same_bits(r.read("f", DType::bf16), f.to(DType::bf16)));
  CHECK(same_bits(r.read("h", DType::bf16), h.to(DType::bf16)));
  CHECK_THROWS_AS(r.read("ids", DType::f32), DTypeError);
  CHECK_THROWS_WITH(r.read("f", DType::i64), Catch::Contains("tensor 'f'") && Catch::Contains(path));
  // read_into: straight into an existing tensor (a parameter), widened the same way.
  Tensor into = empty({65536}, DType::f32);
  r.read_into("b", into);
  CHECK(same_bits(into, bf));
  Tensor f_into = empty({3, 11}, DType::f32);
  r.read_into("f", f_into);
  CHECK(same_bits(f_into, f));
  Tensor wrong = empty({11, 3}, DType::f32);
  CHECK_THROWS_WITH(r.read_into("f", wrong), Catch::Contains("tensor 'f' (f32 [3, 11]) cannot be read into a f32 [11, 3]"));
  Tensor narrow = empty({65536}, DType::bf16);
  r.read_into("b", narrow);  // its own dtype
  CHECK(same_bits(narrow, b));
  Tensor as_f16 = empty({65536}, DType::f16);
  CHECK_THROWS_AS(r.read_into("b", as_f16), DTypeError);
}

TEST_CASE("SafetensorsReader verifies a tensor's checksum when it reads it", "[hf][reader][checksum]") {
  const std::string dir = temp_dir(), path = dir + "/a.safetensors";
  const Tensor good_t = from_vector<float>({1, 2, 3, 4});
  save_safetensors(path, {{"good", good_t}, {"bad", randn({16}).to(DType::bf16)}});
  std::string bytes = read_all(path);
  bytes[data_offset(bytes, "bad") + 3] ^= 0x01;
  write_all(path, bytes);
  SafetensorsReader r(path);  // the header is fine; no data is read yet
  CHECK(r.checksummed());
  CHECK(same_bits(r.read("good"), good_t));  // other tensors still read
  CHECK_THROWS_WITH(r.read("bad"), Catch::Contains(path) && Catch::Contains("checksum mismatch in tensor 'bad'"));
  // The stored bytes are hashed, before any widening.
  CHECK_THROWS_WITH(r.read("bad", DType::f32), Catch::Contains("checksum mismatch in tensor 'bad'"));
  CHECK_THROWS_WITH(load_safetensors(path), Catch::Contains("checksum mismatch in tensor 'bad'"));
  // Without checksums the flip goes unnoticed.
  save_safetensors(path, {{"bad", ones({4})}}, {}, {.checksums = false});
  bytes = read_all(path);
  bytes[data_offset(bytes, "bad")] ^= 0x01;
  write_all(path, bytes);
  CHECK_NOTHROW(SafetensorsReader(path).read("bad"));
}

TEST_CASE("SafetensorsReader rejects bad headers naming the file and the problem", "[hf][reader]") {
  const std::string dir = temp_dir(), path = dir + "/a.safetensors";
  save_safetensors(path, {{"w", ones({4, 4})}, {"b", zeros({4})}});
  const std::string good = read_all(path);
  auto rejects = [&](const std::string& bytes, const std::string& why) {
    write_all(path, bytes);
    CHECK_THROWS_AS(SafetensorsReader(path), IOError);
    CHECK_THROWS_WITH(SafetensorsReader(path), Catch::Contains(path) && Catch::Contains(why));
    // load_safetensors validates the same way with the same message.
    CHECK_THROWS_WITH(load_safetensors(path), Catch::Contains(path) && Catch::Contains(why));
  };
  rejects(good.substr(0, 5), "truncated (5 bytes, no header)");
  rejects(good.substr(0, good.size() - 3), "outside the data section");
  rejects(good + "xx", "data section has");
  std::string bad_json = good;
  bad_json[9] = '#';
  rejects(bad_json, "malformed JSON");
  std::string huge_len = good;
  huge_len[6] = '\x7f';
  rejects(huge_len, "exceeds the file size");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string b = good;
    const auto at = b.find(from);
    REQUIRE(at != std::string::npos);
    REQUIRE(from.size() == to.size());
    b.replace(at, from.size(), to);
    return b;
  };
  rejects(with("\"F32\"", "\"F31\""), "unsupported dtype F31");
  rejects(with("\"shape\":[4,4]", "\"shape\":[4,5]"), "has 64 bytes but shape [4, 5] f32 needs 80");
  rejects(with("\"checksum_algorithm\"", "\"checksum_algorithX\""), "'checksums' without 'checksum_algorithm'");

  // Hand-made headers: overlapping and gapped ranges.
  Json h = Json::object();
  h.set("a", entry("F32", {2}, 0, 8));
  h.set("b", entry("F32", {2}, 4, 12));
  write_sparse(path, h, 12);
  CHECK_THROWS_WITH(SafetensorsReader(path), Catch::Contains("overlap"));
  h.set("b", entry("F32", {2}, 12, 20));
  write_sparse(path, h, 20);
  CHECK_THROWS_WITH(SafetensorsReader(path), Catch::Contains("hole at byte 8"));
  h.set("b", entry("F32", {2}, 8, 16));
  write_sparse(path, h, 16);
  CHECK(SafetensorsReader(path).names().size() == 2);

  // A header length beyond the format's 100 MB limit (in a sparse file big
  // enough to hold it) is refused before anything is allocated for it.
  std::string len(8, '\0');
  const std::uint64_t n = 150'000'000;
  for (int i = 0; i < 8; ++i) len[std::size_t(i)] = char((n >> (8 * i)) & 0xff);
  write_all(path, len);
  fs::resize_file(path, 200'000'000);
  CHECK_THROWS_WITH(SafetensorsReader(path), Catch::Contains("exceeds the format's limit"));

  CHECK_THROWS_WITH(SafetensorsReader(dir + "/missing.safetensors"), Catch::Contains("cannot open") &&
                                                                         Catch::Contains("missing.safetensors"));
  CHECK_THROWS_WITH(SafetensorsReader(dir), Catch::Contains("not a regular file"));
}

TEST_CASE("a 3-shard Hugging Face export reads back bit-exact (f32) and within bf16 rounding", "[hf][checkpoint]") {
  const std::string dir = temp_dir() + "/ckpt";  // created by the save
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"model.embed_tokens.weight", randn({10, 10})},           // 400 bytes in f32
      {"model.layers.0.mlp.up_proj.weight", randn({10, 10}).t()},  // 400, not contiguous
      {"ids", from_vector<std::int64_t>({1, 2, 3, 4})},             // 32, never converted
      {"model.layers.0.input_layernorm.weight", randn({100})},      // 400
      {"model.norm.weight", randn({100}).to(DType::bf16)},          // 400 once converted to f32
      {"lm_head.weight", randn({20, 15})},                          // 1200: a shard of its own
  };
  SECTION("f32") {
    save_hf_checkpoint(dir, tensors, DType::f32, 1000);
    CHECK(listing(dir) == std::set<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                                "model-00003-of-00003.safetensors", "model.safetensors.index.json"});
    const Json index = Json::parse(read_all(dir + "/model.safetensors.index.json"));
    CHECK(index.at("metadata").at("total_size").as_int() == 400 + 400 + 32 + 400 + 400 + 1200);
    const auto& wm = index.at("weight_map");
    CHECK(wm.members().size() == tensors.size());
    CHECK(wm.at("model.embed_tokens.weight").as_string() == "model-00001-of-00003.safetensors");
    CHECK(wm.at("ids").as_string() == "model-00001-of-00003.safetensors");
    CHECK(wm.at("model.layers.0.input_layernorm.weight").as_string() == "model-00002-of-00003.safetensors");
    CHECK(wm.at("model.norm.weight").as_string() == "model-00002-of-00003.safetensors");
    CHECK(wm.at("lm_head.weight").as_string() == "model-00003-of-00003.safetensors");
    // Plain HF files: "format": "pt", no remat checksums.
    for (int i = 1; i <= 3; ++i) {
      SafetensorsReader shard(dir + "/" + hf_shard_name(i, 3));
      CHECK_FALSE(shard.checksummed());
      CHECK(shard.metadata() == std::map<std::string, std::string>{{"format", "pt"}});
      std::uint64_t bytes = 0;
      for (const auto& name : shard.names()) bytes += shard.nbytes(name);
      CHECK((bytes <= 1000 || shard.names().size() == 1));
    }
    CheckpointFiles ckpt(dir);
    CHECK(ckpt.sharded());
    CHECK(ckpt.files().size() == 3);
    CHECK(ckpt.names().size() == tensors.size());
    CHECK(ckpt.total_bytes() == 2832);
    for (const auto& [name, t] : tensors) {
      INFO(name);
      const Tensor want = t.dtype() == DType::i64 ? t : t.to(DType::f32);
      CHECK(ckpt.shape(name) == t.sizes());
      CHECK(ckpt.dtype(name) == want.dtype());
      CHECK(same_bits(ckpt.read(name), want));
    }
    CHECK(ckpt.file_of("lm_head.weight") == "model-00003-of-00003.safetensors");
    CHECK_THROWS_WITH(ckpt.read("missing"), Catch::Contains(dir) && Catch::Contains("'missing'"));
  }
  SECTION("bf16") {
    save_hf_checkpoint(dir, tensors, DType::bf16, 500);  // halves: 200 200 32 | 200 200 | 600
    CheckpointFiles ckpt(dir);
    CHECK(ckpt.files() == std::vector<std::string>{hf_shard_name(1, 3), hf_shard_name(2, 3), hf_shard_name(3, 3)});
    CHECK(ckpt.dtype("ids") == DType::i64);
    for (const auto& [name, t] : tensors) {
      if (t.dtype() == DType::i64) {
        CHECK(same_bits(ckpt.read(name), t));
        continue;
      }
      INFO(name);
      CHECK(ckpt.dtype(name) == DType::bf16);
      const Tensor got = ckpt.read(name, DType::f32);
      // Round to nearest even, exactly the engine's cast, so within half a
      // bf16 ulp (2^-8 relative) of the f32 values.
      CHECK(same_bits(got, t.to(DType::bf16).to(DType::f32)));
      const auto g = got.to_vector<float>(), w = t.to(DType::f32).contiguous().to_vector<float>();
      for (std::size_t i = 0; i < g.size(); ++i) CHECK(std::abs(g[i] - w[i]) <= std::abs(w[i]) * (1.0f / 256));
    }
  }
}

TEST_CASE("a Hugging Face export that fits one shard is model.safetensors; stale files go", "[hf][checkpoint]") {
  const std::string dir = temp_dir();
  const std::vector<std::pair<std::string, Tensor>> small = {{"a", randn({4, 4})}, {"b", randn({8})}};
  const std::vector<std::pair<std::string, Tensor>> big = {
      {"a", randn({4, 4})}, {"b", randn({8})}, {"c", randn({16})}, {"d", randn({16})}};
  write_all(dir + "/config.json", "{}");  // the folder's other files stay

  save_hf_checkpoint(dir, big, DType::f32, 64);  // 64 32 64 64 bytes: a | b | c | d
  const auto first = listing(dir);
  CHECK(first.count("model.safetensors.index.json"));
  CHECK(first.count("model-00001-of-00004.safetensors"));
  // A leftover temporary file of an interrupted export.
  write_all(dir + "/model-00002-of-00002.safetensors.tmp.12345", "partial");

  save_hf_checkpoint(dir, small, DType::f32, 1 << 20);
  CHECK(listing(dir) == std::set<std::string>{"config.json", "model.safetensors"});
  CheckpointFiles one(dir);
  CHECK_FALSE(one.sharded());
  CHECK(one.files() == std::vector<std::string>{"model.safetensors"});
  for (const auto& [name, t] : small) CHECK(same_bits(one.read(name), t));
  SafetensorsReader r(dir + "/model.safetensors");
  CHECK(r.metadata() == std::map<std::string, std::string>{{"format", "pt"}});
  CHECK_FALSE(r.checksummed());

  // Back to shards: the single file goes; then fewer shards: the old ones go.
  save_hf_checkpoint(dir, big, DType::f32, 64);
  CHECK(listing(dir) == std::set<std::string>{"config.json", "model-00001-of-00004.safetensors",
                                              "model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
                                              "model-00004-of-00004.safetensors", "model.safetensors.index.json"});
  save_hf_checkpoint(dir, big, DType::bf16, 48);  // 32 16 32 32 bytes: a b | c | d
  CHECK(listing(dir) == std::set<std::string>{"config.json", "model-00001-of-00003.safetensors",
                                              "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                                              "model.safetensors.index.json"});
  CheckpointFiles three(dir);
  CHECK(three.names() == std::vector<std::string>{"a", "b", "c", "d"});
  CHECK(three.file_of("b") == "model-00001-of-00003.safetensors");
  for (const auto& [name, t] : big) CHECK(same_bits(three.read(name, DType::f32), t.to(DType::bf16).to(DType::f32)));

  // A single tensor larger than the limit is one shard, so one file.
  save_hf_checkpoint(dir, {{"huge", randn({100})}}, DType::f32, 16);
  CHECK(listing(dir) == std::set<std::string>{"config.json", "model.safetensors"});

  CHECK_THROWS_AS(save_hf_checkpoint(dir, small, DType::i64, 100), DTypeError);
  CHECK_THROWS_WITH(save_hf_checkpoint(dir, {{"a", ones({1})}, {"a", ones({1})}}, DType::f32, 100),
                    Catch::Contains("duplicate tensor name 'a'"));
  CHECK(listing(dir) == std::set<std::string>{"config.json", "model.safetensors"});  // refused before touching it
}

TEST_CASE("CheckpointFiles rejects inconsistent folders naming the file and the tensor", "[hf][checkpoint]") {
  const std::string dir = temp_dir();
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"a", randn({16})}, {"b", randn({16})}, {"c", randn({16})}, {"d", randn({16})}};
  save_hf_checkpoint(dir, tensors, DType::f32, 128);  // a b | c d
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string s1 = hf_shard_name(1, 2), s2 = hf_shard_name(2, 2);
  REQUIRE(CheckpointFiles(dir).files() == std::vector<std::string>{s1, s2});
  const std::string good_index = read_all(index_path);
  auto index_with = [&](const std::map<std::string, std::string>& wm) {
    Json j = Json::object(), m = Json::object(), w = Json::object();
    m.set("total_size", Json::number(256));
    for (const auto& [k, v] : wm) w.set(k, Json::string(v));
    j.set("metadata", m);
    j.set("weight_map", w);
    write_all(index_path, j.dump());
  };
  auto rejects = [&](const std::string& what1, const std::string& what2) {
    CHECK_THROWS_AS(CheckpointFiles(dir), IOError);
    CHECK_THROWS_WITH(CheckpointFiles(dir), Catch::Contains(what1) && Catch::Contains(what2));
  };
  const std::map<std::string, std::string> good = {{"a", s1}, {"b", s1}, {"c", s2}, {"d", s2}};

  // A shard the index names is missing.
  index_with({{"a", s1}, {"b", s1}, {"c", s2}, {"d", "model-00009-of-00009.safetensors"}});
  rejects("model-00009-of-00009.safetensors", "which does not exist");
  // A tensor the index lists is not in its shard.
  index_with({{"a", s1}, {"b", s1}, {"c", s1}, {"d", s2}});
  rejects("tensor 'c' to " + s1, "which does not hold it");
  auto extra = good;
  extra["e"] = s2;
  index_with(extra);
  rejects("tensor 'e'", "which does not hold it");
  // A shard holds a tensor the index does not list.
  index_with({{"a", s1}, {"b", s1}, {"c", s2}});
  rejects(s2 + " holds tensor 'd'", "does not list");
  // The index lists a tensor twice (a duplicate key).
  write_all(index_path, "{\"weight_map\": {\"a\": \"" + s1 + "\", \"a\": \"" + s2 + "\"}}");
  rejects(index_path, "duplicate key \"a\"");
  // A tensor is in two shards.
  write_all(index_path, good_index);
  save_safetensors(dir + "/" + s2, {{"c", tensors[2].second}, {"d", tensors[3].second}, {"a", tensors[0].second}},
                   {{"format", "pt"}}, {.checksums = false});
  rejects("tensor 'a' is in both " + s2 + " and " + s1, "weight_map maps it to " + s1);
  save_safetensors(dir + "/" + s2, {{"c", tensors[2].second}, {"d", tensors[3].second}}, {{"format", "pt"}},
                   {.checksums = false});
  CHECK(CheckpointFiles(dir).names().size() == 4);
  // A shard that does not parse.
  write_all(dir + "/" + s2, "garbage");
  rejects(dir + "/" + s2, "not a valid safetensors file");
  // Malformed indexes.
  write_all(index_path, "{\"metadata\": {}}");
  rejects(index_path, "no \"weight_map\"");
  write_all(index_path, "{\"weight_map\": {\"a\": \"../" + s1 + "\"}}");
  rejects(index_path, "not a file name in the folder");
  write_all(index_path, "{\"metadata\": {\"total_size\": -1}, \"weight_map\": {}}");
  rejects(index_path, "total_size");
  write_all(index_path, "[1");
  rejects(index_path, "JSON");
  // Neither file.
  fs::remove(index_path);
  rejects(dir, "neither model.safetensors nor model.safetensors.index.json");
}

TEST_CASE("reading one tensor takes that tensor's memory, not the file's", "[hf][reader][memory]") {
  // A 96 MiB file (a sparse one: its data is a hole of zeros, so writing it
  // takes no memory): a small f32 tensor, a 64 MiB f32 one, a 32 MiB bf16 one.
  const std::string dir = temp_dir(), path = dir + "/big.safetensors";
  const std::int64_t big = 16 * kMiB;  // elements
  Json h = Json::object();
  h.set("small", entry("F32", {4}, 0, 16));
  h.set("big", entry("F32", {big}, 16, 16 + 4 * std::uint64_t(big)));
  h.set("half", entry("BF16", {big}, 16 + 4 * std::uint64_t(big), 16 + 6 * std::uint64_t(big)));
  write_sparse(path, h, 16 + 6 * std::uint64_t(big));
  REQUIRE(fs::file_size(path) > std::uintmax_t(96 * kMiB));

  if (!reset_peak_rss() || proc_status_bytes("VmHWM") < 0) {
    WARN("this kernel cannot reset the peak RSS (/proc/self/clear_refs); memory checks skipped");
    return;
  }
  // The peak RSS rise while `f` runs.
  auto rise = [](auto&& f) {
    REQUIRE(reset_peak_rss());
    const std::int64_t before = proc_status_bytes("VmHWM");
    f();
    return proc_status_bytes("VmHWM") - before;
  };
  SafetensorsReader r(path);
  Tensor small, f32, widened;
  const std::int64_t small_rise = rise([&] { small = r.read("small"); });
  CHECK(small.to_vector<float>() == std::vector<float>{0, 0, 0, 0});
  INFO("reading 16 bytes raised the peak RSS by " << small_rise << " bytes");
  CHECK(small_rise < 4 * kMiB);
  // 64 MiB read into its tensor: the tensor's memory, no copy besides.
  const std::int64_t f32_rise = rise([&] { f32 = r.read("big"); });
  INFO("reading 64 MiB of f32 raised the peak RSS by " << f32_rise << " bytes");
  CHECK(f32_rise > 48 * kMiB);  // the measurement sees a tensor
  // (An ASan build also touches the block's shadow, 1/8 of it, when the
  // allocator unpoisons it.)
  const std::int64_t limit = (detail::kAsanBuild ? 81 : 72) * kMiB;
  CHECK(f32_rise < limit);
  // 32 MiB of bf16 widened to a 64 MiB f32 tensor: no 32 MiB buffer besides.
  const std::int64_t widen_rise = rise([&] { widened = r.read("half", DType::f32); });
  INFO("reading 32 MiB of bf16 as f32 raised the peak RSS by " << widen_rise << " bytes");
  CHECK(widen_rise < limit);
  CHECK(widened.dtype() == DType::f32);
  CHECK(widened.numel() == big);
  // The whole file: its tensors (96 MiB), not a copy of the file besides.
  const std::int64_t load_rise = rise([&] { CHECK(load_safetensors(path).tensors.size() == 3); });
  INFO("load_safetensors of the 96 MiB file raised the peak RSS by " << load_rise << " bytes");
  CHECK(load_rise < 120 * kMiB);
}
