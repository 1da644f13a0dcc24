// Token shards (train/token_shards.h): written by ShardWriter, read back
// memory-mapped, split, sampled without crossing shards; and the errors a
// bad shard folder gets.
#include "train_test_util.h"

#include <cstdio>
#include <filesystem>
#include <set>

#include "engine/error.h"
#include "train/data.h"
#include "train/token_shards.h"

using namespace remat;
using namespace remat::test;

namespace {
const std::string kHash = "0123456789abcdef";
}

TEST_CASE("token shards: written, mapped back, split and sampled", "[train][shards]") {
  const std::string dir = temp_dir("shards") + "/out";
  std::vector<std::vector<std::int32_t>> docs;
  std::vector<std::int64_t> stream;  // every token as written, EOS included
  for (int d = 0; d < 40; ++d) {
    std::vector<std::int32_t> ids;
    for (int i = 0; i < 50 + 7 * d; ++i) ids.push_back((d * 131 + i * 17) % 999);
    docs.push_back(ids);
    for (auto id : ids) stream.push_back(id);
    stream.push_back(999);  // EOS
  }
  {
    ShardWriter w(dir, 1000, kHash, 999, 2000);
    for (const auto& d : docs) w.add_document(d);
    w.close();
    CHECK(w.token_bytes() == 2);
    CHECK(w.tokens() == std::int64_t(stream.size()));
    CHECK(w.documents() == 40);
    CHECK(w.files().size() == (stream.size() + 1999) / 2000);
  }
  const auto m = MappedShards::open(dir);
  CHECK(m->vocab() == 1000);
  CHECK(m->tokenizer_hash() == kHash);
  CHECK(m->tokens() == std::int64_t(stream.size()));
  std::int64_t at = 0;
  for (std::size_t s = 0; s < m->shards().size(); ++s) {
    const TokenSpan t = m->span(s);
    CHECK(m->shards()[s].eos == 999);
    for (std::int64_t i = 0; i < t.count; ++i) REQUIRE(t.at(i) == stream[std::size_t(at + i)]);
    at += t.count;
  }
  // 10% of every shard held out; sampled windows never cross shards.
  Corpus c = shard_corpus(dir, 33);
  CHECK(c.vocab == 1000);
  const TokenSource train = c.train_source(), val = c.val_source();
  REQUIRE(train.size() == m->shards().size());
  for (std::size_t s = 0; s < train.size(); ++s) CHECK(train[s].count + val[s].count == m->shards()[s].count);
  BatchSampler a(train, 16, 32, 7), b(train, 16, 32, 7);
  for (int round = 0; round < 5; ++round) {
    const auto x = a.next().to_vector<std::int64_t>(), y = b.next().to_vector<std::int64_t>();
    CHECK(x == y);  // deterministic from the seed
    for (int row = 0; row < 16; ++row) {
      // The window is a contiguous run of one shard's training part.
      bool found = false;
      for (const auto& t : train)
        for (std::int64_t s0 = 0; s0 + 33 <= t.count && !found; ++s0) {
          bool same = true;
          for (std::int64_t i = 0; i < 33 && same; ++i) same = t.at(s0 + i) == x[std::size_t(row * 33 + i)];
          found = same;
        }
      CHECK(found);
    }
  }
}

TEST_CASE("token shards: 4-byte ids for a large vocabulary, no EOS", "[train][shards]") {
  const std::string dir = temp_dir("shards32") + "/o";
  ShardWriter w(dir, 200000, kHash, -1);
  w.add_document({0, 65535, 65536, 199999});
  w.close();
  const auto m = MappedShards::open(dir);
  REQUIRE(m->shards().size() == 1);
  CHECK(m->shards()[0].token_bytes == 4);
  CHECK(m->shards()[0].eos == -1);
  const TokenSpan t = m->span(0);
  CHECK(t.count == 4);
  CHECK(t.at(1) == 65535);
  CHECK(t.at(2) == 65536);
  CHECK(t.at(3) == 199999);
  CHECK_THROWS_WITH(w.add_document({200000}), Catch::Contains("outside the vocabulary"));
}

TEST_CASE("token shards: errors name the file and the problem", "[train][shards]") {
  const std::string root = temp_dir("shardbad");
  const std::string dir = root + "/o";
  {
    ShardWriter w(dir, 1000, kHash, 1, 64);
    std::vector<std::int32_t> ids(200, 5);
    w.add_document(ids);
  }
  // A folder with shards is not written into again.
  CHECK_THROWS_WITH(ShardWriter(dir, 1000, kHash, 1), Catch::Contains("is not empty") && Catch::Contains("a shard"));
  // Nor is a folder that holds anything else (#43: the help says new or empty).
  const std::string used = root + "/used";
  std::filesystem::create_directories(used);
  write_all(used + "/notes.txt", "mine");
  CHECK_THROWS_WITH(ShardWriter(used, 1000, kHash, 1),
                    Catch::Contains("is not empty") && Catch::Contains("notes.txt") && Catch::Contains("empty or new folder"));
  CHECK(read_all(used + "/notes.txt") == "mine");
  // Truncated.
  const std::string first = dir + "/shard-00000.tok";
  std::string bytes = read_all(first);
  write_all(first, bytes.substr(0, bytes.size() - 3));
  CHECK_THROWS_WITH(MappedShards::open(dir), Catch::Contains("shard-00000.tok") && Catch::Contains("truncated"));
  // Not a shard.
  write_all(first, std::string(100, 'x'));
  CHECK_THROWS_WITH(MappedShards::open(dir), Catch::Contains("not a token shard"));
  write_all(first, bytes);
  // Another tokenizer's shard in the same folder.
  {
    ShardWriter w(root + "/p", 1000, "fedcba9876543210", 1);
    w.add_document({1, 2, 3});
  }
  std::filesystem::copy_file(root + "/p/shard-00000.tok", dir + "/shard-99999.tok");
  CHECK_THROWS_WITH(MappedShards::open(dir), Catch::Contains("fedcba9876543210"));
  CHECK_THROWS_WITH(MappedShards::open(root + "/none"), Catch::Contains("cannot open"));
  std::filesystem::create_directories(root + "/empty");
  CHECK_THROWS_WITH(MappedShards::open(root + "/empty"), Catch::Contains("holds no token shards"));
  CHECK(is_shard_data(dir));
  CHECK_FALSE(is_shard_data(root + "/empty"));
}

TEST_CASE("token shards: a shard above 4 GiB maps and reads at offsets past 2^31 tokens", "[train][shards]") {
  // A sparse file: the header, then 2^31 + 2^30 uint16 tokens (6 GiB of
  // holes) whose last few tokens are written; nothing else takes disk space.
  const std::string dir = temp_dir("shardbig");
  const std::string path = dir + "/shard-00000.tok";
  const std::int64_t count = (std::int64_t(1) << 31) + (std::int64_t(1) << 30);
  {
    ShardWriter w(dir + "/w", 1000, kHash, 7);
    w.add_document({1, 2, 3});
    w.close();
    std::string header = read_all(w.files().at(0)).substr(0, 64);
    for (int i = 0; i < 8; ++i) header[16 + i] = char(std::uint64_t(count) >> (8 * i));  // the token count
    std::FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    REQUIRE(std::fwrite(header.data(), 1, 64, f) == 64);
    REQUIRE(std::fclose(f) == 0);
    std::filesystem::resize_file(path, 64 + std::uintmax_t(count) * 2);
    std::FILE* g = std::fopen(path.c_str(), "r+b");
    REQUIRE(g != nullptr);
    const unsigned char tail[6] = {11, 0, 22, 0, 0xe7, 0x03};  // 11, 22, 999
    REQUIRE(std::fseek(g, long(64 + (count - 3) * 2), SEEK_SET) == 0);
    REQUIRE(std::fwrite(tail, 1, 6, g) == 6);
    REQUIRE(std::fclose(g) == 0);
  }
  const auto m = MappedShards::open(path);
  REQUIRE(m->tokens() == count);
  const TokenSpan t = m->span(0);
  CHECK(t.at(count - 3) == 11);
  CHECK(t.at(count - 2) == 22);
  CHECK(t.at(count - 1) == 999);
  CHECK(t.at(std::int64_t(1) << 31) == 0);
  // Windows anywhere in it (one span whose starts fit 32 bits).
  BatchSampler s({t}, 4, 16, 1);
  const auto x = s.next().to_vector<std::int64_t>();
  CHECK(x.size() == 4 * 17);
  // The val split of the big shard ends at the file's end.
  const TokenSource val = m->val(0.1);
  CHECK(val[0].at(val[0].count - 1) == 999);
}
