// Training data: byte level (vocab 256), a built-in generated corpus with a
// known entropy floor or any text file; or token shards (train/
// token_shards.h) memory-mapped; and a seeded batch sampler whose state is a
// Philox (seed, offset), so a resumed run draws the same batches.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/rng.h"
#include "engine/tensor.h"
#include "train/token_shards.h"

namespace remat {

// A corpus split into training and held-out bytes.
struct Corpus {
  std::string name;
  std::vector<std::uint8_t> train;
  std::vector<std::uint8_t> val;
  // Entropy rate of the source in nats per byte (the best loss any model can
  // reach); negative when unknown (text files).
  double entropy_floor = -1;
  // Token shards (shard_corpus): the mapped files and their split; the byte
  // vectors above stay empty.
  std::shared_ptr<MappedShards> shards;
  TokenSource train_tokens, val_tokens;
  std::int64_t vocab = 256;  // token ids are < vocab

  // What samplers draw from: the shards' split, or the bytes above (which
  // must outlive the sampler).
  TokenSource train_source() const;
  TokenSource val_source() const;
};

// The generated corpus: an order-2 Markov chain over a 20-letter alphabet in
// which every two-letter context has four possible successors with
// probabilities 0.5, 0.25, 0.15 and 0.1 (drawn per context from the seed).
// Its entropy rate is exactly H(0.5, 0.25, 0.15, 0.1) nats per byte.
Corpus generated_corpus(std::uint64_t seed, std::int64_t train_bytes = 1 << 21,
                        std::int64_t val_bytes = 1 << 16);

// A [rows, cols] i64 batch of token ids drawn uniformly from [0, vocab)
// by Philox from `seed` (the same ids on every machine).
Tensor uniform_token_ids(std::int64_t rows, std::int64_t cols, std::int64_t vocab, std::uint64_t seed);

// A text file read as bytes; the last `val_fraction` is held out. Throws
// IOError if the file cannot be read or is too short for one window.
Corpus text_corpus(const std::string& path, std::int64_t window, double val_fraction = 0.1);

// True if `path` is token shards (a *.tok file, or a folder holding any),
// not a text file.
bool is_shard_data(const std::string& path);

// Token shards at `path` (a shard or a folder of them): every shard's last
// `val_fraction` held out. Throws IOError (naming the file) for a bad shard
// or a split with no room for one window of `window` tokens.
Corpus shard_corpus(const std::string& path, std::int64_t window, double val_fraction = 0.1);

// A range of sequence lengths [min, max] (--seq-range MIN:MAX[:log]).
struct SeqRange {
  std::int64_t min = 0, max = 0;
  // Lengths drawn with P(S) proportional to 1/S (log-uniform: as many
  // batches in [64, 128) as in [256, 512), most of them short, as document
  // lengths are) instead of uniformly.
  bool log = false;
};

// "MIN:MAX" or "MIN:MAX:log" (e.g. "64:512") as a SeqRange; Error naming
// `flag` and the text unless both are integers with 1 <= MIN <= MAX.
SeqRange parse_seq_range(const std::string& text, const std::string& flag = "--seq-range");
// The text parse_seq_range reads back.
std::string seq_range_text(const SeqRange& r);

// Draws batches of `batch` windows of `seq + 1` tokens at Philox-random
// offsets; a window never crosses from one span (shard) into the next.
// With a SeqRange, every batch first draws its own length S from the
// integers [min, max], uniformly or log-uniformly (one 64-bit Philox draw
// from the same generator; the log-uniform inverse CDF in IEEE sums only,
// so a seed gives the same lengths and windows everywhere and state() /
// set_state() resume exactly), then its windows of S + 1 tokens.
class BatchSampler {
 public:
  BatchSampler(const std::vector<std::uint8_t>& data, std::int64_t batch, std::int64_t seq,
               std::uint64_t seed);
  // The spans must outlive the sampler. Throws Error if no span holds a window.
  BatchSampler(TokenSource source, std::int64_t batch, std::int64_t seq, std::uint64_t seed);
  // A length per batch from `range`. Throws Error for a range that is not
  // 1 <= min <= max, or if no span holds a window of range.max + 1 tokens.
  BatchSampler(const std::vector<std::uint8_t>& data, std::int64_t batch, SeqRange range, std::uint64_t seed);
  BatchSampler(TokenSource source, std::int64_t batch, SeqRange range, std::uint64_t seed);
  // The next batch as an i64 tensor [batch, S + 1]: S is seq, or the length
  // drawn for this batch from the range.
  Tensor next();
  RngState state() const { return gen_.state(); }
  void set_state(RngState s) { gen_.set_state(s); }

 private:
  std::int64_t draw_seq();  // a length from range_ (one reservation of two words)

  TokenSource source_;
  std::vector<std::int64_t> windows_;  // cumulative window starts per span (windows of seq_ + 1)
  std::int64_t batch_, seq_;           // seq_: the fixed length, or the range's max
  std::optional<SeqRange> range_;
  std::vector<double> cumulative_;     // log-uniform: sum of 1/s for s in [min, min + i]
  Generator gen_;
};

}  // namespace remat
