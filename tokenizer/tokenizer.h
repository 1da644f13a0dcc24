// Text tokenizers: text to token ids and back, for training on raw text and
// for matching the ids of a pretrained model. Two kinds behind one interface:
// Hugging Face tokenizer.json files with a byte-level BPE model (GPT-2,
// Llama 3, Mistral NeMo, Qwen 2/3; tokenizer/bpe.h) and SentencePiece .model files
// (tokenizer/sentencepiece.h). Depends on engine/ only
// (docs/REFERENCE.md#tokenizers).
//
// Every method is const and safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace remat {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of `text`, with no BOS/EOS or template tokens added: what Hugging
  // Face `tokenizer.encode(text, add_special_tokens=False)` gives. Added
  // tokens (special or not) that occur literally in the text are recognised
  // and map to their ids. Invalid UTF-8 is first replaced as
  // replace_invalid_utf8 does (BPE; see the kind's header for SentencePiece).
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;

  // The text of `ids`, special tokens included as their text (HF decode with
  // skip_special_tokens=False, no clean-up of spaces); byte sequences that
  // are not valid UTF-8 come out as U+FFFD. Throws remat::Error on an id
  // outside [0, vocab_size()) or one the vocabulary does not define.
  virtual std::string decode(const std::vector<std::int32_t>& ids) const = 0;

  // One past the largest id, added tokens included (every id encode returns
  // is below it): the embedding table's row count.
  virtual std::int64_t vocab_size() const = 0;

  // The end- and beginning-of-sequence ids, if the tokenizer has them.
  virtual std::optional<std::int32_t> eos_id() const = 0;
  virtual std::optional<std::int32_t> bos_id() const = 0;

  // "bpe" or "sentencepiece".
  virtual std::string kind() const = 0;

  // XXH3-64 of the loaded file's bytes (tokenizer.json or the .model; not a
  // sibling tokenizer_config.json) as 16 lower-case hex digits.
  virtual std::string hash() const = 0;
};

// Loads a tokenizer from `path`: a file named *.json (a HF tokenizer.json)
// gives the BPE tokenizer, a file named *.model a SentencePiece one, a
// directory its tokenizer.json or else its tokenizer.model. Throws IOError
// naming the path when it is missing, unreadable or holds neither file, and
// remat::Error when the file's contents are not a supported tokenizer.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// `bytes` with every maximal invalid UTF-8 subsequence replaced by U+FFFD,
// the way WHATWG's TextDecoder (and Rust's from_utf8_lossy) replace them:
// "\xff" is one U+FFFD, a truncated "\xe2\x82" is one, "\xed\xa0\x80" (a
// surrogate) is three. Valid UTF-8 comes back unchanged.
std::string replace_invalid_utf8(std::string_view bytes);

namespace tokenizer_detail {

// The whole file at `path`; throws IOError naming it (and `what` it should
// be) when it cannot be read.
std::string read_file(const std::string& path, const std::string& what);

// Whether `bytes` is valid UTF-8 (replace_invalid_utf8 would not change it).
bool valid_utf8(std::string_view bytes);

// XXH3-64 of `bytes` as 16 lower-case hex digits.
std::string xxh3_hex(std::string_view bytes);

}  // namespace tokenizer_detail
}  // namespace remat
