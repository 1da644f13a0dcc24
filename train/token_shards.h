// Token shard files, written by `./remat tokenize` and read by `train --data
// DIR`: a 64-byte header, then the tokens as little-endian uint16 (vocabulary
// up to 65536) or uint32. Documents follow one another, each ended by the
// tokenizer's EOS when it has one. Read memory-mapped (no copy of the file;
// files above 4 GiB work).
//
// Header (little-endian):
//   0  char[8]  magic "RMTOKEN1"
//   8  u32      token bytes (2 or 4)
//  12  u32      reserved (0)
//  16  u64      token count
//  24  u64      vocabulary size
//  32  char[16] tokenizer hash (16 hex digits, tokenizer/tokenizer.h)
//  48  i64      EOS id (-1: none)
//  56  u64      documents
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace remat {

// A run of tokens in memory: `count` values of `width` bytes (1, 2 or 4,
// little-endian unsigned) from `data`.
struct TokenSpan {
  const void* data = nullptr;
  std::int64_t count = 0;
  int width = 1;
  std::int64_t at(std::int64_t i) const {
    const auto* p = static_cast<const unsigned char*>(data);
    switch (width) {
      case 1: return p[i];
      case 2: return std::int64_t(p[2 * i]) | std::int64_t(p[2 * i + 1]) << 8;
      default: {
        const unsigned char* q = p + 4 * i;
        return std::int64_t(q[0]) | std::int64_t(q[1]) << 8 | std::int64_t(q[2]) << 16 | std::int64_t(q[3]) << 24;
      }
    }
  }
};
using TokenSource = std::vector<TokenSpan>;

struct ShardInfo {
  std::string path;
  int token_bytes = 2;
  std::int64_t count = 0;
  std::int64_t vocab = 0;
  std::string tokenizer_hash;  // 16 hex digits
  std::int64_t eos = -1;
  std::int64_t documents = 0;
};

// Writes shards DIR/shard-00000.tok, ... of at most `tokens_per_shard`
// tokens each (a document may span two shards). The header is written when
// a shard is complete (close() completes the last), through a temporary file
// renamed into place, so a shard on disk is always whole.
class ShardWriter {
 public:
  // Creates DIR if missing; throws IOError if it cannot, or if DIR holds
  // anything (naming an entry: shards never mix with other files).
  ShardWriter(std::string dir, std::int64_t vocab, std::string tokenizer_hash, std::int64_t eos,
              std::int64_t tokens_per_shard = std::int64_t(1) << 28);
  ~ShardWriter();  // closes (errors are lost: call close() to see them)
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends one document's ids (and EOS if the tokenizer has one). Throws
  // Error for an id outside [0, vocab), IOError on a failed write.
  void add_document(const std::vector<std::int32_t>& ids);
  // Completes the last shard. Throws IOError on failure.
  void close();
  std::int64_t tokens() const { return total_; }
  std::int64_t documents() const { return docs_; }
  const std::vector<std::string>& files() const { return files_; }
  int token_bytes() const { return width_; }

 private:
  struct Open;
  void roll();
  void finish_shard();
  std::string dir_, hash_;
  std::int64_t vocab_, eos_, per_shard_;
  int width_;
  std::unique_ptr<Open> open_;
  std::int64_t total_ = 0, docs_ = 0;
  std::vector<std::string> files_;
};

// Shards mapped read-only into memory for as long as this lives.
class MappedShards {
 public:
  // `path`: a shard file or a folder of *.tok shards (sorted by name). Every
  // header is checked (magic, token bytes, the file's size against its
  // count) and every shard must name the same tokenizer and vocabulary;
  // IOError names the file and the problem.
  static std::shared_ptr<MappedShards> open(const std::string& path);
  ~MappedShards();
  MappedShards(const MappedShards&) = delete;
  MappedShards& operator=(const MappedShards&) = delete;

  const std::vector<ShardInfo>& shards() const { return info_; }
  std::int64_t vocab() const { return info_.front().vocab; }
  const std::string& tokenizer_hash() const { return info_.front().tokenizer_hash; }
  std::int64_t tokens() const;
  // The first 1 - val_fraction of every shard's tokens, and the rest.
  TokenSource train(double val_fraction) const;
  TokenSource val(double val_fraction) const;
  // Every token of shard i.
  TokenSpan span(std::size_t i) const;

 private:
  MappedShards() = default;
  struct Map {
    void* addr = nullptr;
    std::size_t length = 0;
  };
  std::vector<ShardInfo> info_;
  std::vector<Map> maps_;
};

// Reads the header of one shard file (IOError naming the problem).
ShardInfo read_shard_header(const std::string& path);

// The header of the shard `path` of `file_size` bytes, from its first bytes
// `head` (the whole 64-byte header when the file has it; more is ignored):
// what read_shard_header checks and returns, with the same errors.
ShardInfo parse_shard_header(std::string_view head, std::uint64_t file_size, const std::string& path);

}  // namespace remat
