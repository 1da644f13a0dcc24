// Byte-level BPE from a Hugging Face tokenizer.json: the forms GPT-2,
// Llama 3, Mistral NeMo and Qwen 2/3 use (checked id for id against a
// reference on Mistral NeMo's and Qwen 3's, tests/tokenizer).
//
// Supported (anything else is rejected naming the field and its value):
//   normalizer     null, NFC, or a Sequence of NFC (ICU)
//   pre_tokenizer  ByteLevel, or a Sequence of Split (Regex or String
//                  pattern, behavior Isolated, invert false) and ByteLevel;
//                  ByteLevel with add_prefix_space false, use_regex true
//                  splitting first with GPT-2's pattern. Regexes run in
//                  PCRE2 (UTF + UCP); \s and \S mean Unicode White_Space, as
//                  in the reference's Oniguruma (U+0085 is a space, U+FEFF
//                  is not).
//   model          BPE: vocab, merges ("a b" strings or [a, b] pairs),
//                  ignore_merges, unk_token; no dropout, byte_fallback,
//                  continuing_subword_prefix or end_of_word_suffix
//   added_tokens   special or not, lstrip/rstrip/single_word, normalized
//                  (matched after the normalizer) or not (matched first, in
//                  the raw text); leftmost-longest, as HF does
//   decoder        ByteLevel (or null)
// post_processor and truncation/padding are ignored: encode adds no tokens.
// Ids (vocab and added tokens) must be below 2^22 (4194304).
//
// Encoding: the input is made valid UTF-8 first (replace_invalid_utf8: the
// reference tokenizers take strings, so the JS/HF path sees each invalid
// sequence as U+FFFD), then split on added tokens, normalized, pre-tokenized
// and merged by rank (lowest rank first, leftmost among equal ranks), with a
// cache of recent pre-tokens.
//
// EOS/BOS: eos_token/bos_token of a tokenizer_config.json beside the file
// (a string or {"content": ...}; null means none), else the first added token
// of <|end_of_text|>, <|endoftext|>, <|im_end|>, </s> (EOS) and
// <|begin_of_text|>, <s> (BOS).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "tokenizer/tokenizer.h"

namespace remat {

class BpeTokenizer : public Tokenizer {
 public:
  // Loads tokenizer.json at `path` and the tokenizer_config.json in its
  // folder, if there is one. Throws IOError naming the path when a file
  // cannot be read or parsed, remat::Error naming the path and the field
  // when its contents are unsupported.
  static std::unique_ptr<BpeTokenizer> from_file(const std::string& path);

  // From the text of a tokenizer.json (and of a tokenizer_config.json, if
  // any); `what` names the source in errors.
  static std::unique_ptr<BpeTokenizer> from_json(const std::string& tokenizer_json,
                                                 const std::optional<std::string>& config_json,
                                                 const std::string& what);

  ~BpeTokenizer() override;

  std::vector<std::int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override;
  std::optional<std::int32_t> eos_id() const override;
  std::optional<std::int32_t> bos_id() const override;
  std::string kind() const override { return "bpe"; }
  std::string hash() const override;

  // The id of token `text` (as written in the file, byte-level characters
  // for vocab entries; added tokens by their content), if it has one.
  std::optional<std::int32_t> token_id(const std::string& text) const;

  struct Impl;

 private:
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace remat
