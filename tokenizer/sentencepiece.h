// SentencePiece .model files, through Debian's libsentencepiece.
//
// encode: the input is made valid UTF-8 first (replace_invalid_utf8), split
// on the text of the model's control and unknown pieces (<s>, </s>, <unk>,
// ...: what HF's slow tokenizers do with special tokens), and each run in
// between is encoded by the library on its own (user-defined pieces are
// recognised by the library; no BOS/EOS is added). decode: the runs between
// control/unknown ids are decoded by the library, those ids come out as their
// piece text. The library's normalization (e.g. nmt_nfkc, collapsing extra
// spaces) applies, so decode(encode(x)) == x only for text already in the
// model's normal form.
#pragma once

#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace remat {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Loads the .model at `path`. Throws IOError naming the path when it cannot
  // be read, remat::Error naming it when it is not a SentencePiece model.
  static std::unique_ptr<SentencePieceTokenizer> from_file(const std::string& path);

  // From the bytes of a .model file (a serialized ModelProto); `what` names
  // the source in errors.
  static std::unique_ptr<SentencePieceTokenizer> from_bytes(const std::string& bytes, const std::string& what);

  ~SentencePieceTokenizer() override;

  std::vector<std::int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override;
  std::optional<std::int32_t> eos_id() const override;
  std::optional<std::int32_t> bos_id() const override;
  std::string kind() const override { return "sentencepiece"; }
  std::string hash() const override;

  struct Impl;

 private:
  explicit SentencePieceTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace remat
