#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>
#include <unistd.h>

#include "train/safetensors.h"
#include "tests/train/train_test_util.h"

using namespace remat;

namespace {
using test::read_all;
using test::write_all;
std::string temp_dir() { return test::temp_dir("st"); }
}  // namespace

TEST_CASE("safetensors round-trips every dtype with metadata", "[safetensors]") {
  const std::string dir = temp_dir(), path = dir + "/a.safetensors";
  Tensor f = from_vector<float>({1.5f, -2, 3, 4, 5, 6}, {2, 3});
  Tensor i = from_vector<std::int64_t>({7, 8, 9});
  Tensor h = from_vector<float>({1, 2}).to(DType::bf16);
  Tensor s = full({}, 3.25);
  save_safetensors(path, {{"w", f.t()}, {"ids", i}, {"half", h}, {"scalar", s}}, {{"step", "12"}},
                   {.checksums = false});
  SafetensorsFile r = load_safetensors(path);
  CHECK(r.metadata.at("step") == "12");
  CHECK(!r.checksummed);
  CHECK(r.tensors.at("w").sizes() == Shape{3, 2});
  CHECK(r.tensors.at("w").to_vector<float>() == f.t().contiguous().to_vector<float>());
  CHECK(r.tensors.at("ids").to_vector<std::int64_t>() == std::vector<std::int64_t>{7, 8, 9});
  CHECK(r.tensors.at("half").dtype() == DType::bf16);
  CHECK(r.tensors.at("scalar").dim() == 0);
  CHECK(r.tensors.at("scalar").item() == 3.25);
  // The header is what the format says: 8-byte length, JSON, aligned data.
  const std::string bytes = read_all(path);
  std::uint64_t n = 0;
  for (int k = 0; k < 8; ++k) n |= std::uint64_t(static_cast<unsigned char>(bytes[std::size_t(k)])) << (8 * k);
  CHECK((8 + n) % 8 == 0);
  CHECK(bytes.substr(8, n).find("\"dtype\":\"F32\"") != std::string::npos);
  CHECK(bytes.substr(8, n).find("\"__metadata__\":{\"step\":\"12\"}") != std::string::npos);
  CHECK_THROWS_WITH(save_safetensors(path, {{"a", f}, {"a", f}}), Catch::Contains("duplicate tensor name 'a'"));
}

TEST_CASE("truncated or corrupt safetensors files are rejected with a clear error", "[safetensors]") {
  const std::string dir = temp_dir(), path = dir + "/a.safetensors";
  save_safetensors(path, {{"w", ones({4, 4})}, {"b", zeros({4})}});
  const std::string good = read_all(path);

  write_all(path, good.substr(0, good.size() - 3));
  CHECK_THROWS_WITH(load_safetensors(path), Catch::Contains("outside the data section") ||
                                                Catch::Contains("data section has"));
  write_all(path, good.substr(0, 5));
  CHECK_THROWS_WITH(load_safetensors(path), Catch::Contains("truncated"));
  std::string bad_json = good;
  bad_json[9] = '#';
  write_all(path, bad_json);
  CHECK_THROWS_WITH(load_safetensors(path), Catch::Contains("malformed JSON"));
  std::string huge_len = good;
  huge_len[6] = '\x7f';
  write_all(path, huge_len);
  CHECK_THROWS_WITH(load_safetensors(path), Catch::Contains("exceeds the file size"));
  write_all(path, good + "xx");
  CHECK_THROWS_WITH(load_safetensors(path), Catch::Contains("data section has"));
  CHECK_THROWS_AS(load_safetensors(dir + "/missing.safetensors"), IOError);
  write_all(path, good);
  CHECK(load_safetensors(path).tensors.size() == 2);
}

TEST_CASE("atomic writes leave no temporary files and replace the old file whole", "[safetensors]") {
  const std::string dir = temp_dir(), path = dir + "/a.safetensors";
  save_safetensors(path, {{"w", ones({2})}});
  save_safetensors(path, {{"w", full({3}, 2.0)}});
  CHECK(load_safetensors(path).tensors.at("w").to_vector<float>() == std::vector<float>{2, 2, 2});
  // Nothing but the file itself is left in the folder.
  const std::string listing = [&] {
    std::string cmd = "ls -A " + dir;
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    char buf[256];
    while (p && std::fgets(buf, sizeof buf, p)) out += buf;
    if (p) ::pclose(p);
    return out;
  }();
  CHECK(listing == "a.safetensors\n");
  // A failed write (unwritable folder) throws and leaves the old file.
  CHECK_THROWS_AS(save_safetensors(dir + "/no/such/dir/x.safetensors", {{"w", ones({1})}}), IOError);
}

namespace {
// The byte offset of tensor `name`'s data in a file (from its header).
std::size_t data_offset(const std::string& bytes, const std::string& name) {
  std::uint64_t n = 0;
  for (int k = 0; k < 8; ++k) n |= std::uint64_t(static_cast<unsigned char>(bytes[std::size_t(k)])) << (8 * k);
  const std::string header = bytes.substr(8, n);
  const auto at = header.find("\"" + name + "\":{");
  REQUIRE(at != std::string::npos);
  const auto offs = header.find("\"data_offsets\":[", at);
  return 8 + n + std::stoull(header.substr(offs + 16));
}
}  // namespace

TEST_CASE("xxh3_64 is XXH3-64 with seed 0 (reference vectors)", "[safetensors][checksum]") {
  CHECK(xxh3_64("", 0) == 0x2d06800538d394c2ull);
  CHECK(xxh3_64("abc", 3) == 0x78af5f94892f3950ull);
}

TEST_CASE("every tensor carries an XXH3-64 checksum in __metadata__", "[safetensors][checksum]") {
  const std::string dir = temp_dir(), path = dir + "/a.safetensors";
  Tensor w = from_vector<float>({1, 2, 3, 4}, {2, 2});
  Tensor e = zeros({0});
  save_safetensors(path, {{"w", w}, {"empty", e}}, {{"step", "3"}});
  const std::string bytes = read_all(path);
  std::uint64_t n = 0;
  for (int k = 0; k < 8; ++k) n |= std::uint64_t(static_cast<unsigned char>(bytes[std::size_t(k)])) << (8 * k);
  const std::string header = bytes.substr(8, n);
  CHECK_THAT(header, Catch::Contains("\"checksum_algorithm\":\"xxh3-64\""));
  // The value is a JSON object (as a string) of name -> 16 hex digits; the
  // empty tensor hashes to XXH3-64 of no bytes.
  CHECK_THAT(header, Catch::Contains("\"checksums\":\"{\\\"empty\\\":\\\"2d06800538d394c2\\\",\\\"w\\\":\\\""));
  char want[17];
  std::snprintf(want, sizeof want, "%016llx",
                static_cast<unsigned long long>(xxh3_64(bytes.data() + data_offset(bytes, "w"), 16)));
  CHECK_THAT(header, Catch::Contains(std::string("\\\"w\\\":\\\"") + want + "\\\""));
  SafetensorsFile r = load_safetensors(path);
  CHECK(r.checksummed);
  CHECK(r.metadata == std::map<std::string, std::string>{{"step", "3"}});  // the checksum keys are not handed back
  CHECK(r.tensors.at("w").to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  // Reserved keys cannot be written by callers.
  CHECK_THROWS_WITH(save_safetensors(path, {{"w", w}}, {{"checksums", "{}"}}), Catch::Contains("reserved"));
}

TEST_CASE("a flipped byte inside a tensor's data is rejected naming that tensor", "[safetensors][checksum]") {
  const std::string dir = temp_dir(), path = dir + "/a.safetensors";
  save_safetensors(path, {{"first", from_vector<float>({1, 2, 3})}, {"second", from_vector<float>({4, 5, 6, 7})}});
  const std::string good = read_all(path);
  for (const std::string name : {"first", "second"}) {
    INFO(name);
    std::string bad = good;
    bad[data_offset(good, name) + 5] ^= 0x10;  // one bit of one byte
    write_all(path, bad);
    CHECK_THROWS_AS(load_safetensors(path), IOError);
    CHECK_THROWS_WITH(load_safetensors(path), Catch::Contains("checksum mismatch in tensor '" + name + "'") &&
                                                  Catch::Contains(path));
  }
  // Without checksums the same flip goes unnoticed: that is what they are for.
  save_safetensors(path, {{"first", from_vector<float>({1, 2, 3})}}, {}, {.checksums = false});
  std::string plain = read_all(path);
  plain[data_offset(plain, "first") + 1] ^= 0x10;
  write_all(path, plain);
  CHECK(!load_safetensors(path).checksummed);
}

TEST_CASE("malformed checksum metadata is rejected", "[safetensors][checksum]") {
  const std::string dir = temp_dir(), path = dir + "/a.safetensors";
  save_safetensors(path, {{"w", ones({4})}});
  const std::string good = read_all(path);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string b = good;
    const auto at = b.find(from);
    REQUIRE(at != std::string::npos);
    REQUIRE(from.size() == to.size());  // the header length stays right
    b.replace(at, from.size(), to);
    write_all(path, b);
  };
  with("xxh3-64", "xxh3-65");
  CHECK_THROWS_WITH(load_safetensors(path), Catch::Contains("unsupported checksum algorithm 'xxh3-65'"));
  with("\"checksum_algorithm\"", "\"checksum_algorithX\"");
  CHECK_THROWS_WITH(load_safetensors(path), Catch::Contains("'checksums' without 'checksum_algorithm'"));
  with("{\\\"w\\\"", "{\\\"v\\\"");
  CHECK_THROWS_WITH(load_safetensors(path), Catch::Contains("names 'v', which is not a tensor"));
  const auto at = good.find("\\\"w\\\":\\\"") + 8;
  with(good.substr(at, 4), "XYZW");
  CHECK_THROWS_WITH(load_safetensors(path), Catch::Contains("checksum of tensor 'w' is not 16 lowercase hex digits"));
  with("\"checksums\":\"{", "\"checksums\":\"[");
  CHECK_THROWS_WITH(load_safetensors(path), Catch::Contains("checksums") && Catch::Contains("not a valid safetensors file"));
}

TEST_CASE("decode_safetensors gives load_safetensors' results and errors, naming its source", "[safetensors]") {
  const std::string dir = temp_dir(), path = dir + "/a.safetensors";
  save_safetensors(path, {{"w", from_vector<float>({1, 2, 3, 4}, {2, 2})},
                          {"h", from_vector<float>({0.5f, -1}).to(DType::bf16)},
                          {"i", from_vector<std::int64_t>({7})}},
                   {{"step", "3"}});
  const std::string good = read_all(path);
  // The file itself, then every byte of it changed once, and a few lengths.
  std::vector<std::string> variants{good, good.substr(0, 5), good.substr(0, good.size() - 1), good + "x", ""};
  for (std::size_t i = 0; i < good.size(); ++i) {
    std::string b = good;
    b[i] = char(b[i] ^ (i < 8 ? 0x40 : 0x01));
    variants.push_back(b);
  }
  int accepted = 0, rejected = 0;
  for (std::size_t v = 0; v < variants.size(); ++v) {
    INFO("variant " << v);
    write_all(path, variants[v]);
    std::string file_error, memory_error;
    SafetensorsFile from_file, from_memory;
    try {
      from_file = load_safetensors(path);
    } catch (const IOError& e) {
      file_error = e.what();
    }
    try {
      from_memory = decode_safetensors(variants[v], "bytes");
    } catch (const IOError& e) {
      memory_error = e.what();
    }
    if (!file_error.empty()) {
      ++rejected;
      // The same message, with the name where the file's path was.
      std::string expected = file_error;
      for (auto at = expected.find(path); at != std::string::npos; at = expected.find(path, at + 5))
        expected.replace(at, path.size(), "bytes");
      CHECK(memory_error == expected);
      continue;
    }
    ++accepted;
    REQUIRE(memory_error.empty());
    CHECK(from_memory.metadata == from_file.metadata);
    CHECK(from_memory.checksummed == from_file.checksummed);
    REQUIRE(from_memory.tensors.size() == from_file.tensors.size());
    for (const auto& [name, t] : from_file.tensors) {
      const Tensor& m = from_memory.tensors.at(name);
      CHECK(m.dtype() == t.dtype());
      CHECK(m.sizes() == t.sizes());
      CHECK(std::string(static_cast<const char*>(m.raw_data()), m.nbytes()) ==
            std::string(static_cast<const char*>(t.raw_data()), t.nbytes()));
    }
  }
  CHECK(accepted >= 1);  // the file itself (and flips inside the header's padding)
  CHECK(rejected > 100);
  // A reader over bytes reads one tensor at a time, as over a file.
  const SafetensorsReader r = SafetensorsReader::from_bytes(good, "bytes");
  CHECK(r.path() == "bytes");
  CHECK(r.checksummed());
  CHECK(r.read("h", DType::f32).to_vector<float>() == std::vector<float>{0.5f, -1});
  CHECK(r.read("w").to_vector<float>() == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("read_range_into reads one range of a flattened tensor, widening bf16", "[safetensors][zero]") {
  const std::string dir = temp_dir(), path = dir + "/r.safetensors";
  std::vector<float> v(37);
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = 0.5f * float(k) - 3.0f;  // (exact in bf16)
  const Tensor f = from_vector<float>(v, {37});
  save_safetensors(path, {{"f", f.view({37})}, {"b", f.to(DType::bf16)}});
  const SafetensorsReader r(path);
  for (const auto& [begin, n] : std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 37}, {5, 9}, {36, 1}, {3, 0}})
    for (const char* name : {"f", "b"}) {
      INFO(name << " [" << begin << ", " << begin + n << ")");
      Tensor out = empty({n});
      r.read_range_into(name, begin, out);
      CHECK(out.to_vector<float>() == std::vector<float>(v.begin() + begin, v.begin() + begin + n));
    }
  Tensor past = empty({4});
  CHECK_THROWS_WITH(r.read_range_into("f", 35, past), Catch::Contains("elements [35, 39) of tensor 'f'"));
  Tensor as_bf16 = empty({2}, DType::bf16);
  CHECK_THROWS_WITH(r.read_range_into("f", 0, as_bf16), Catch::Contains("cannot be read into a bf16"));
}

TEST_CASE("verify hashes a tensor in bounded chunks: a flipped byte in any chunk is named, a good one passes",
          "[safetensors][checksum][zero]") {
  const std::string dir = temp_dir(), path = dir + "/v.safetensors";
  // 3 Mi floats = 12 MiB: two 8 MiB chunks, the second partial.
  const std::int64_t n = 3 << 20;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = float(k % 1000) * 0.25f;
  save_safetensors(path, {{"big", from_vector<float>(v, {n})}, {"small", from_vector<float>({1, 2, 3})}});
  const std::string good = read_all(path);
  {
    const SafetensorsReader r(path);
    CHECK_NOTHROW(r.verify("big"));
    CHECK_NOTHROW(r.verify("small"));
    CHECK_THROWS_WITH(r.verify("absent"), Catch::Contains("no tensor 'absent'"));
  }
  for (const std::int64_t at : {std::int64_t(5), (std::int64_t(9) << 20) + 3, n * 4 - 1}) {
    INFO("byte " << at << " of 'big' flipped");
    std::string bad = good;
    bad[data_offset(good, "big") + std::size_t(at)] ^= 0x04;
    write_all(path, bad);
    const SafetensorsReader r(path);
    CHECK_THROWS_WITH(r.verify("big"), Catch::Contains("checksum mismatch in tensor 'big'") && Catch::Contains(path));
    CHECK_NOTHROW(r.verify("small"));
    // The range read itself does not check (verify is what makes it safe).
    Tensor part = empty({4});
    r.read_range_into("big", 8, part);
  }
  // Without checksums there is nothing to verify.
  save_safetensors(path, {{"small", from_vector<float>({1, 2, 3})}}, {}, {.checksums = false});
  CHECK_NOTHROW(SafetensorsReader(path).verify("small"));
}
