#include "train/data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/error.h"

namespace remat {

namespace {
constexpr char kAlphabet[] = "etaoinshrdlucmfwypb ";  // 20 symbols
constexpr int kSymbols = 20;
constexpr double kProbs[4] = {0.5, 0.25, 0.15, 0.1};

// Successor table: for each context (a, b), four distinct successors.
struct Chain {
  int next[kSymbols][kSymbols][4];
};

Chain make_chain(std::uint64_t seed) {
  Chain c{};
  std::vector<std::uint32_t> w(std::size_t(kSymbols * kSymbols * 8));
  philox_fill_words(w.data(), std::int64_t(w.size()), RngState{seed ^ 0x5eed5eedull, 0});
  std::size_t k = 0;
  for (int a = 0; a < kSymbols; ++a)
    for (int b = 0; b < kSymbols; ++b) {
      int chosen = 0;
      while (chosen < 4) {
        const int cand = int(w[k++ % w.size()] % kSymbols);
        bool dup = false;
        for (int j = 0; j < chosen; ++j) dup = dup || c.next[a][b][j] == cand;
        if (!dup) c.next[a][b][chosen++] = cand;
        if (k > w.size() * 4) break;  // cannot happen with 20 symbols; guards the loop
      }
    }
  return c;
}

std::vector<std::uint8_t> sample(const Chain& c, std::int64_t n, std::uint64_t seed, std::uint64_t stream) {
  std::vector<float> u(static_cast<std::size_t>(n));
  philox_fill_uniform(u.data(), n, RngState{seed, stream << 40});
  std::vector<std::uint8_t> out(static_cast<std::size_t>(n));
  int a = 0, b = 1;
  for (std::int64_t i = 0; i < n; ++i) {
    double acc = 0;
    int pick = 3;
    for (int j = 0; j < 4; ++j) {
      acc += kProbs[j];
      if (u[std::size_t(i)] < acc) {
        pick = j;
        break;
      }
    }
    const int s = c.next[a][b][pick];
    out[std::size_t(i)] = std::uint8_t(kAlphabet[s]);
    a = b;
    b = s;
  }
  return out;
}
}  // namespace

Corpus generated_corpus(std::uint64_t seed, std::int64_t train_bytes, std::int64_t val_bytes) {
  const Chain c = make_chain(seed);
  Corpus corpus;
  corpus.name = "generated (order-2 Markov, seed " + std::to_string(seed) + ")";
  corpus.train = sample(c, train_bytes, seed, 1);
  corpus.val = sample(c, val_bytes, seed, 2);
  double h = 0;
  for (double p : kProbs) h -= p * std::log(p);
  corpus.entropy_floor = h;
  return corpus;
}

Corpus text_corpus(const std::string& path, std::int64_t window, double val_fraction) {
  std::ifstream in(path, std::ios::binary);
  REMAT_CHECK(in.good(), IOError, "--data: cannot read ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  const auto n = std::int64_t(s.size());
  const auto nval = std::int64_t(double(n) * val_fraction);
  REMAT_CHECK(n - nval > window && nval > window, IOError, "--data: ", path, " has ", n,
              " bytes; need more than ", window, " for training and for the held-out ",
              int(val_fraction * 100), "% (windows of ", window, " bytes)");
  Corpus c;
  c.name = path;
  c.train.assign(s.begin(), s.begin() + (n - nval));
  c.val.assign(s.begin() + (n - nval), s.end());
  return c;
}

TokenSource Corpus::train_source() const {
  if (shards) return train_tokens;
  return {TokenSpan{train.data(), std::int64_t(train.size()), 1}};
}

TokenSource Corpus::val_source() const {
  if (shards) return val_tokens;
  return {TokenSpan{val.data(), std::int64_t(val.size()), 1}};
}

bool is_shard_data(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".tok") return true;
    return false;
  }
  return fs::path(path).extension() == ".tok";
}

Corpus shard_corpus(const std::string& path, std::int64_t window, double val_fraction) {
  Corpus c;
  c.shards = MappedShards::open(path);
  c.name = path + " (" + std::to_string(c.shards->tokens()) + " tokens in " + std::to_string(c.shards->shards().size()) +
           " shard" + (c.shards->shards().size() == 1 ? "" : "s") + ", tokenizer " + c.shards->tokenizer_hash() + ")";
  c.vocab = c.shards->vocab();
  c.train_tokens = c.shards->train(val_fraction);
  c.val_tokens = c.shards->val(val_fraction);
  auto longest = [](const TokenSource& s) {
    std::int64_t m = 0;
    for (const auto& t : s) m = std::max(m, t.count);
    return m;
  };
  REMAT_CHECK(longest(c.train_tokens) > window && longest(c.val_tokens) > window, IOError, "--data: ", path,
              " has ", c.shards->tokens(), " tokens; a shard needs more than ", window, " for training and for the held-out ",
              int(val_fraction * 100), "% (windows of ", window, " tokens)");
  return c;
}

namespace {
// Cumulative counts of the windows of `window` tokens per span (starts 0 ..
// count - window of each span), with the total last.
std::vector<std::int64_t> window_starts(const TokenSource& source, std::int64_t window) {
  std::vector<std::int64_t> out;
  std::int64_t total = 0;
  for (const auto& t : source) {
    out.push_back(total);
    total += std::max<std::int64_t>(0, t.count - window + 1);
  }
  out.push_back(total);
  return out;
}
}  // namespace

SeqRange parse_seq_range(const std::string& full, const std::string& flag) {
  std::string text = full;
  bool log = false;
  if (text.size() > 4 && text.compare(text.size() - 4, 4, ":log") == 0) {
    log = true;
    text.resize(text.size() - 4);
  }
  const auto colon = text.find(':');
  auto number = [&](const std::string& part) -> std::int64_t {
    const bool digits = !part.empty() && part.size() <= 12 && part.find_first_not_of("0123456789") == std::string::npos;
    return digits ? std::stoll(part) : -1;
  };
  SeqRange r;
  if (colon != std::string::npos) r = {number(text.substr(0, colon)), number(text.substr(colon + 1))};
  REMAT_CHECK(colon != std::string::npos && r.min >= 1 && r.max >= 1, Error, flag, " '", full,
              "': expected MIN:MAX or MIN:MAX:log, two integers >= 1 (e.g. 64:512)");
  REMAT_CHECK(r.min <= r.max, Error, flag, " ", full, ": MIN (", r.min, ") must be <= MAX (", r.max, ")");
  r.log = log;
  return r;
}

std::string seq_range_text(const SeqRange& r) {
  return std::to_string(r.min) + ":" + std::to_string(r.max) + (r.log ? ":log" : "");
}

BatchSampler::BatchSampler(const std::vector<std::uint8_t>& data, std::int64_t batch, std::int64_t seq,
                           std::uint64_t seed)
    : BatchSampler(TokenSource{TokenSpan{data.data(), std::int64_t(data.size()), 1}}, batch, seq, seed) {}

BatchSampler::BatchSampler(TokenSource source, std::int64_t batch, std::int64_t seq, std::uint64_t seed)
    : source_(std::move(source)), batch_(batch), seq_(seq), gen_(seed) {
  windows_ = window_starts(source_, seq + 1);
  std::int64_t all = 0;
  for (const auto& t : source_) all += t.count;
  REMAT_CHECK(windows_.back() > 0 && (source_.size() > 1 || source_[0].count > seq + 1), Error, "BatchSampler: ", all,
              " tokens of data are too few for windows of ", seq + 1);
}

BatchSampler::BatchSampler(const std::vector<std::uint8_t>& data, std::int64_t batch, SeqRange range,
                           std::uint64_t seed)
    : BatchSampler(TokenSource{TokenSpan{data.data(), std::int64_t(data.size()), 1}}, batch, range, seed) {}

BatchSampler::BatchSampler(TokenSource source, std::int64_t batch, SeqRange range, std::uint64_t seed)
    : source_(std::move(source)), batch_(batch), seq_(range.max), range_(range), gen_(seed) {
  REMAT_CHECK(range.min >= 1 && range.min <= range.max, Error, "BatchSampler: the range of sequence lengths [",
              range.min, ", ", range.max, "] must have 1 <= min <= max");
  windows_ = window_starts(source_, seq_ + 1);
  if (range.log) {
    double sum = 0;
    for (std::int64_t s = range.min; s <= range.max; ++s) cumulative_.push_back(sum += 1.0 / double(s));
  }
  std::int64_t all = 0;
  for (const auto& t : source_) all += t.count;
  REMAT_CHECK(windows_.back() > 0 && (source_.size() > 1 || source_[0].count > seq_ + 1), Error, "BatchSampler: ",
              all, " tokens of data are too few for windows of ", seq_ + 1, " (the longest of the range ", range.min,
              ":", range.max, ")");
}

std::int64_t BatchSampler::draw_seq() {
  std::uint32_t w[2];
  philox_fill_words(w, 2, gen_.reserve(2));
  const std::uint64_t r = std::uint64_t(w[0]) << 32 | w[1];
  if (!range_->log) return range_->min + std::int64_t(r % std::uint64_t(range_->max - range_->min + 1));
  // The inverse CDF at u in [0, 1): the first length whose cumulative weight
  // passes u of the total (IEEE sums and a product: the same on every machine).
  const double u = double(r >> 11) * 0x1p-53;
  const auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), u * cumulative_.back());
  return range_->min + std::min<std::int64_t>(it - cumulative_.begin(), std::int64_t(cumulative_.size()) - 1);
}

Tensor BatchSampler::next() {
  // A length per batch (drawn before its windows), else seq_.
  const std::int64_t S = range_ ? draw_seq() : seq_;
  const std::vector<std::int64_t> shorter = S == seq_ ? std::vector<std::int64_t>() : window_starts(source_, S + 1);
  const std::vector<std::int64_t>& windows = S == seq_ ? windows_ : shorter;
  std::vector<std::int64_t> tokens(std::size_t(batch_ * (S + 1)));
  // One span whose starts fit 32 bits: one word per window (the original
  // sampler, whose batches existing runs and states depend on); else two
  // words (a 64-bit draw) over every span's starts.
  const bool narrow = source_.size() == 1 && std::uint64_t(source_[0].count) - std::uint64_t(S + 1) < (1ull << 32);
  const std::int64_t words = narrow ? batch_ : 2 * batch_;
  const RngState s = gen_.reserve(std::uint64_t(words));
  std::vector<std::uint32_t> w(static_cast<std::size_t>(words));
  philox_fill_words(w.data(), words, s);
  for (std::int64_t b = 0; b < batch_; ++b) {
    std::size_t span = 0;
    std::uint64_t start = 0;
    if (narrow) {
      const auto range = std::uint64_t(source_[0].count) - std::uint64_t(S + 1);
      start = std::uint64_t(w[std::size_t(b)]) % (range + 1);
    } else {
      const std::uint64_t r = std::uint64_t(w[std::size_t(2 * b)]) << 32 | w[std::size_t(2 * b + 1)];
      const std::uint64_t pick = r % std::uint64_t(windows.back());
      span = std::size_t(std::upper_bound(windows.begin(), windows.end(), std::int64_t(pick)) - windows.begin() - 1);
      start = pick - std::uint64_t(windows[span]);
    }
    const TokenSpan& t = source_[span];
    for (std::int64_t i = 0; i <= S; ++i)
      tokens[std::size_t(b * (S + 1) + i)] = t.at(std::int64_t(start) + i);
  }
  return from_vector<std::int64_t>(tokens, {batch_, S + 1});
}

}  // namespace remat

namespace remat {

Tensor uniform_token_ids(std::int64_t rows, std::int64_t cols, std::int64_t vocab, std::uint64_t seed) {
  REMAT_CHECK(rows > 0 && cols > 0 && vocab > 0, ShapeError, "uniform_token_ids: need rows, cols and vocab > 0, got ",
              rows, ", ", cols, ", ", vocab);
  // Two words per id (a 64-bit draw), reduced modulo the vocabulary: the
  // bias is below vocab / 2^64.
  std::vector<std::uint32_t> w(std::size_t(2 * rows * cols));
  philox_fill_words(w.data(), std::int64_t(w.size()), RngState{seed, 0});
  std::vector<std::int64_t> ids(std::size_t(rows * cols));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = std::int64_t(((std::uint64_t(w[2 * i]) << 32) | w[2 * i + 1]) % std::uint64_t(vocab));
  return from_vector<std::int64_t>(ids, {rows, cols});
}

}  // namespace remat
