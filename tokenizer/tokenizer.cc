// load_tokenizer and the helpers every kind shares: reading files, hashing,
// and WHATWG-style replacement of invalid UTF-8.
#include "tokenizer/tokenizer.h"

#include <xxhash.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "engine/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/sentencepiece.h"

namespace remat {
namespace {

// The length of the valid UTF-8 sequence starting at s[i], or 0 when the
// sequence there is invalid; `bad_end` is then set to the end of its maximal
// invalid subpart (WHATWG: the lead byte and the continuation bytes that were
// still possible, at least one byte).
std::size_t utf8_sequence(std::string_view s, std::size_t i, std::size_t& bad_end) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return 1;
  std::size_t need = 0;
  unsigned char lower = 0x80, upper = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lower = 0xA0;
    if (b == 0xED) upper = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lower = 0x90;
    if (b == 0xF4) upper = 0x8F;  // nothing above U+10FFFF
  } else {
    bad_end = i + 1;
    return 0;
  }
  std::size_t j = i + 1;
  for (std::size_t k = 0; k < need; ++k, ++j) {
    if (j >= s.size()) {
      bad_end = j;
      return 0;
    }
    const auto c = static_cast<unsigned char>(s[j]);
    if (c < lower || c > upper) {
      bad_end = j;
      return 0;
    }
    lower = 0x80;
    upper = 0xBF;
  }
  return need + 1;
}

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string replace_invalid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  std::size_t i = 0;
  while (i < bytes.size()) {
    std::size_t bad_end = 0;
    const std::size_t n = utf8_sequence(bytes, i, bad_end);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i = bad_end;
    }
  }
  return out;
}

namespace tokenizer_detail {

bool valid_utf8(std::string_view bytes) {
  std::size_t i = 0;
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    std::size_t bad_end = 0;
    const std::size_t n = utf8_sequence(bytes, i, bad_end);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string read_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  REMAT_CHECK(std::filesystem::exists(path, ec), IOError, path, ": no such file (expected ", what, ")");
  REMAT_CHECK(std::filesystem::is_regular_file(path, ec), IOError, path, ": not a regular file (expected ", what,
              ")");
  std::ifstream in(path, std::ios::binary);
  REMAT_CHECK(in.good(), IOError, path, ": cannot be opened (expected ", what, ")");
  std::ostringstream os;
  os << in.rdbuf();
  REMAT_CHECK(!in.bad(), IOError, path, ": read failed (expected ", what, ")");
  return os.str();
}

std::string xxh3_hex(std::string_view bytes) {
  const XXH64_hash_t h = XXH3_64bits(bytes.data(), bytes.size());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace tokenizer_detail

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  REMAT_CHECK(fs::exists(path, ec), IOError, path,
              ": no such file or directory (expected a tokenizer.json, a .model file or a folder with one)");
  if (fs::is_directory(path, ec)) {
    const fs::path json = fs::path(path) / "tokenizer.json";
    const fs::path model = fs::path(path) / "tokenizer.model";
    if (fs::is_regular_file(json, ec)) return BpeTokenizer::from_file(json.string());
    if (fs::is_regular_file(model, ec)) return SentencePieceTokenizer::from_file(model.string());
    throw IOError(path + ": the folder has neither tokenizer.json nor tokenizer.model");
  }
  if (has_suffix(path, ".json")) return BpeTokenizer::from_file(path);
  if (has_suffix(path, ".model")) return SentencePieceTokenizer::from_file(path);
  throw IOError(path + ": not a tokenizer file (expected a tokenizer.json, a SentencePiece .model or a folder)");
}

}  // namespace remat
