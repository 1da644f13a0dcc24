// SentencePiece through Debian's libsentencepiece (see sentencepiece.h).
#include "tokenizer/sentencepiece.h"

#include <sentencepiece_processor.h>

#include <utility>

#include "engine/error.h"

namespace remat {

struct SentencePieceTokenizer::Impl {
  std::string what;
  std::string hash;
  sentencepiece::SentencePieceProcessor processor;
  // Control and unknown pieces: matched in the text, decoded as their text.
  std::vector<std::pair<std::string, std::int32_t>> specials;
  std::vector<bool> is_special;
  // An ordinary piece without a leading "▁" (-1: none), put before the
  // pieces that follow an unknown piece inside one encoded run, so that the
  // library keeps their leading space (it drops the first piece's "▁" at the
  // start of a decode: the dummy prefix of a run).
  int sentinel = -1;

  void encode_run(std::string_view run, std::vector<std::int32_t>& out) const {
    if (run.empty()) return;
    std::vector<int> ids;
    const auto status = processor.Encode(run, &ids);
    REMAT_CHECK(status.ok(), Error, what, ": encode failed: ", status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }

  std::vector<std::int32_t> encode(std::string_view input) const {
    std::string storage;
    std::string_view text = input;
    if (!tokenizer_detail::valid_utf8(input)) text = storage = replace_invalid_utf8(input);
    std::vector<std::int32_t> out;
    std::size_t pos = 0;
    while (pos < text.size()) {
      // The leftmost special piece, the longest where several start there.
      std::size_t best = std::string_view::npos, best_len = 0;
      std::int32_t best_id = -1;
      for (const auto& [piece, id] : specials) {
        const std::size_t at = text.find(piece, pos);
        if (at == std::string_view::npos) continue;
        if (at < best || (at == best && piece.size() > best_len)) {
          best = at;
          best_len = piece.size();
          best_id = id;
        }
      }
      if (best == std::string_view::npos) break;
      encode_run(text.substr(pos, best - pos), out);
      out.push_back(best_id);
      pos = best + best_len;
    }
    if (pos < text.size()) encode_run(text.substr(pos), out);
    return out;
  }

  std::string decode_ids(const std::vector<int>& ids) const {
    std::string text;
    const auto status = processor.Decode(ids, &text);
    REMAT_CHECK(status.ok(), Error, what, ": decode failed: ", status.ToString());
    return text;
  }

  // `run` decoded as the start of an encoded run, or as the continuation of
  // one (`continues`: it follows an unknown piece the library produced).
  std::string decode_run(const std::vector<int>& run, bool continues) const {
    if (run.empty()) return {};
    if (!continues || sentinel < 0) return decode_ids(run);
    std::vector<int> with{sentinel};
    with.insert(with.end(), run.begin(), run.end());
    const std::string prefix = decode_ids({sentinel}), text = decode_ids(with);
    return text.compare(0, prefix.size(), prefix) == 0 ? text.substr(prefix.size()) : decode_ids(run);
  }

  std::string decode(const std::vector<std::int32_t>& ids) const {
    const int size = processor.GetPieceSize();
    std::string out;
    std::vector<int> run;
    bool continues = false;
    for (std::int32_t id : ids) {
      REMAT_CHECK(id >= 0 && id < size, Error, what, ": decode: id ", id, " is not in the vocabulary (size ", size,
                  ")");
      if (is_special[static_cast<std::size_t>(id)]) {
        out += decode_run(run, continues);
        run.clear();
        out += processor.IdToPiece(id);
        // A control piece ends an encoded run (encode matched it in the
        // text); an unknown one came from inside a run.
        continues = processor.IsUnknown(id);
      } else {
        run.push_back(id);
      }
    }
    out += decode_run(run, continues);
    return replace_invalid_utf8(out);
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::from_bytes(const std::string& bytes,
                                                                           const std::string& what) {
  auto impl = std::make_unique<Impl>();
  impl->what = what;
  impl->hash = tokenizer_detail::xxh3_hex(bytes);
  const auto status = impl->processor.LoadFromSerializedProto(bytes);
  REMAT_CHECK(status.ok(), Error, what, ": not a SentencePiece model: ", status.ToString());
  const int size = impl->processor.GetPieceSize();
  impl->is_special.assign(static_cast<std::size_t>(size), false);
  for (int id = 0; id < size; ++id) {
    if (!impl->processor.IsControl(id) && !impl->processor.IsUnknown(id)) continue;
    impl->is_special[static_cast<std::size_t>(id)] = true;
    const std::string& piece = impl->processor.IdToPiece(id);
    if (!piece.empty()) impl->specials.emplace_back(piece, id);
  }
  for (int id = 0; id < size && impl->sentinel < 0; ++id) {
    const auto& p = impl->processor;
    if (p.IsControl(id) || p.IsUnknown(id) || p.IsUnused(id) || p.IsByte(id)) continue;
    const std::string& piece = p.IdToPiece(id);
    if (!piece.empty() && piece.rfind("\xe2\x96\x81", 0) != 0 && !impl->decode_ids({id}).empty()) impl->sentinel = id;
  }
  return std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer(std::move(impl)));
}

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::from_file(const std::string& path) {
  return from_bytes(tokenizer_detail::read_file(path, "a SentencePiece .model"), path);
}

std::vector<std::int32_t> SentencePieceTokenizer::encode(std::string_view text) const { return impl_->encode(text); }
std::string SentencePieceTokenizer::decode(const std::vector<std::int32_t>& ids) const { return impl_->decode(ids); }
std::int64_t SentencePieceTokenizer::vocab_size() const { return impl_->processor.GetPieceSize(); }

std::optional<std::int32_t> SentencePieceTokenizer::eos_id() const {
  const int id = impl_->processor.eos_id();
  return id >= 0 ? std::optional<std::int32_t>(id) : std::nullopt;
}

std::optional<std::int32_t> SentencePieceTokenizer::bos_id() const {
  const int id = impl_->processor.bos_id();
  return id >= 0 ? std::optional<std::int32_t>(id) : std::nullopt;
}

std::string SentencePieceTokenizer::hash() const { return impl_->hash; }

}  // namespace remat
