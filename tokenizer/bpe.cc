// Byte-level BPE from a Hugging Face tokenizer.json (see bpe.h for what is
// supported). The pipeline of encode: replace invalid UTF-8, split on added
// tokens (not normalized ones in the raw text, then normalized ones after
// NFC), pre-tokenize with the Split regexes (PCRE2), and merge each piece's
// bytes by rank. Vocabulary entries are stored by their raw bytes (the
// byte-level alphabet is a bijection with bytes), so pieces are never
// converted to byte-level characters.
#include "tokenizer/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <utility>

#include "engine/error.h"
#include "engine/json.h"

namespace remat {
namespace {

using tokenizer_detail::read_file;

// ---- Byte-level alphabet (GPT-2's bytes_to_unicode) ----

struct ByteAlphabet {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<int, 512> cp_to_byte{};  // -1 where no byte maps to the code point

  ByteAlphabet() {
    cp_to_byte.fill(-1);
    auto printable = [](int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174); };
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      byte_to_cp[static_cast<std::size_t>(b)] = static_cast<char32_t>(printable(b) ? b : next++);
      cp_to_byte[byte_to_cp[static_cast<std::size_t>(b)]] = b;
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// The raw bytes a byte-level token stands for; nullopt when one of its
// characters is outside the alphabet (such a token cannot come out of
// byte-level pre-tokenization; it decodes to its own UTF-8).
std::optional<std::string> byte_level_to_raw(const std::string& token) {
  std::string raw;
  raw.reserve(token.size());
  std::int32_t i = 0;
  const auto n = static_cast<std::int32_t>(token.size());
  const auto* s = reinterpret_cast<const std::uint8_t*>(token.data());
  while (i < n) {
    UChar32 c;
    U8_NEXT(s, i, n, c);
    if (c < 0 || c >= 512 || alphabet().cp_to_byte[static_cast<std::size_t>(c)] < 0) return std::nullopt;
    raw.push_back(static_cast<char>(alphabet().cp_to_byte[static_cast<std::size_t>(c)]));
  }
  return raw;
}

// ---- Hashing helpers for string_view lookups ----

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>>;

// ---- PCRE2 regex ----

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
using MatchData = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

// `pattern` with \s and \S as Unicode White_Space (what Oniguruma, the
// reference's engine, means by them; PCRE2's UCP \s leaves out U+0085).
std::string white_space_as_property(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c != '\\' || i + 1 == pattern.size()) {
      out.push_back(c);
      continue;
    }
    const char e = pattern[i + 1];
    if (e == 'Q') {  // \Q...\E: literal text, copied as is
      const std::size_t end = pattern.find("\\E", i + 2);
      const std::size_t stop = end == std::string::npos ? pattern.size() : end + 2;
      out.append(pattern, i, stop - i);
      i = stop - 1;
      continue;
    }
    if (e == 's')
      out += "\\p{White_Space}";
    else if (e == 'S')
      out += "\\P{White_Space}";
    else {
      out.push_back(c);
      out.push_back(e);
    }
    ++i;
  }
  return out;
}

// `literal` as a PCRE2 pattern matching exactly it.
std::string escape_literal(const std::string& literal) {
  std::string out;
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& what) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    const std::string translated = white_space_as_property(pattern);
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr));
    if (!code_) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      throw Error(detail::concat(what, ": regex ", Json::quote(pattern), " does not compile (at offset ", offset,
                                 "): ", reinterpret_cast<const char*>(message.data())));
    }
    jit_ = pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE) == 0;
  }

  MatchData match_data() const { return MatchData(pcre2_match_data_create_from_pattern(code_.get(), nullptr)); }

  // The next match in `text` at or after `start`, as [begin, end); false when
  // there is none. `text` must be valid UTF-8.
  bool find(std::string_view text, std::size_t start, pcre2_match_data* md, std::size_t& begin,
            std::size_t& end) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    int rc = jit_ ? pcre2_jit_match(code_.get(), subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr)
                  : PCRE2_ERROR_JIT_BADOPTION;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION)
      rc = pcre2_match(code_.get(), subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(rc, message.data(), message.size());
      throw Error(detail::concat("tokenizer: regex match failed: ", reinterpret_cast<const char*>(message.data())));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    begin = ov[0];
    end = ov[1];
    return true;
  }

 private:
  std::unique_ptr<pcre2_code, CodeDeleter> code_;
  bool jit_ = false;
};

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---- UTF-8 helpers ----

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

bool is_white_space(UChar32 c) { return u_hasBinaryProperty(c, UCHAR_WHITE_SPACE) != 0; }
bool is_word_char(UChar32 c) { return c == '_' || u_isalnum(c) != 0; }

UChar32 char_before(std::string_view s, std::size_t pos) {
  if (pos == 0) return U_SENTINEL;
  auto i = static_cast<std::int32_t>(pos);
  UChar32 c;
  U8_PREV(reinterpret_cast<const std::uint8_t*>(s.data()), 0, i, c);
  return c;
}

UChar32 char_at(std::string_view s, std::size_t pos) {
  if (pos >= s.size()) return U_SENTINEL;
  auto i = static_cast<std::int32_t>(pos);
  UChar32 c;
  U8_NEXT(reinterpret_cast<const std::uint8_t*>(s.data()), i, static_cast<std::int32_t>(s.size()), c);
  return c;
}

// ---- Added tokens: a byte trie, leftmost-longest ----

struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

class AddedTokenMatcher {
 public:
  void add(const AddedToken& token, std::size_t index) {
    if (token.content.empty()) return;
    std::size_t node = 0;
    for (char c : token.content) {
      const auto byte = static_cast<unsigned char>(c);
      auto& kids = nodes_[node].children;
      auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& k) { return k.first == byte; });
      if (it == kids.end()) {
        kids.emplace_back(byte, nodes_.size());
        node = nodes_.size();
        nodes_.emplace_back();
      } else {
        node = it->second;
      }
    }
    nodes_[node].token = static_cast<std::int64_t>(index);
    first_[static_cast<unsigned char>(token.content[0])] = true;
    empty_ = false;
  }

  bool empty() const { return empty_; }

  // The longest token starting at `pos`, as (token index, length); index -1
  // when none does.
  std::pair<std::int64_t, std::size_t> longest_at(std::string_view text, std::size_t pos) const {
    std::pair<std::int64_t, std::size_t> best{-1, 0};
    if (!first_[static_cast<unsigned char>(text[pos])]) return best;
    std::size_t node = 0;
    for (std::size_t i = pos; i < text.size(); ++i) {
      const auto byte = static_cast<unsigned char>(text[i]);
      const auto& kids = nodes_[node].children;
      auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& k) { return k.first == byte; });
      if (it == kids.end()) break;
      node = it->second;
      if (nodes_[node].token >= 0) best = {nodes_[node].token, i + 1 - pos};
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::size_t>> children;
    std::int64_t token = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
  bool empty_ = true;
};

// A run of the text: either plain text to tokenize or an added token's id.
struct Segment {
  std::string_view text;
  std::int32_t added_id = -1;
};

// Token ids must be below this: the loader keeps a table indexed by id, so an
// id far past the vocabulary would cost memory for every id below it. The
// largest vocabularies in use have about 2^18 tokens.
constexpr std::int64_t kMaxTokenIds = std::int64_t{1} << 22;

// ---- JSON access with precise errors ----

const Json& member(const Json& object, const std::string& key, const std::string& where) {
  REMAT_CHECK(object.is_object(), Error, where, ": expected an object");
  REMAT_CHECK(object.has(key), Error, where, ": missing \"", key, "\"");
  return object.at(key);
}

std::string type_of(const Json& object, const std::string& where) {
  const Json& t = member(object, "type", where);
  REMAT_CHECK(t.is_string(), Error, where, ".type: expected a string");
  return t.as_string();
}

bool bool_or(const Json& object, const std::string& key, bool fallback, const std::string& where) {
  if (!object.has(key) || object.at(key).is_null()) return fallback;
  REMAT_CHECK(object.at(key).type() == Json::Type::boolean, Error, where, ".", key, ": expected true or false");
  return object.at(key).as_bool();
}

// Null or absent, or the given string.
bool null_or(const Json& object, const std::string& key, const std::string& allowed) {
  if (!object.has(key) || object.at(key).is_null()) return true;
  return object.at(key).is_string() && object.at(key).as_string() == allowed;
}

}  // namespace

// ---- The tokenizer ----

struct BpeTokenizer::Impl {
  std::string what;
  std::string hash;

  // Vocabulary by raw bytes; tokens outside the byte-level alphabet by text.
  StringMap raw_vocab;
  StringMap other_vocab;
  std::array<std::int32_t, 256> byte_id{};
  // id -> bytes decode emits; defined[id] says whether the id exists.
  std::vector<std::string> id_bytes;
  std::vector<bool> defined;
  std::vector<bool> is_added;
  std::optional<std::int32_t> unk_id;
  bool ignore_merges = false;

  struct Merge {
    std::int32_t rank;
    std::int32_t new_id;
  };
  std::unordered_map<std::uint64_t, Merge> merges;

  std::vector<AddedToken> added;
  AddedTokenMatcher raw_matcher;         // added tokens with normalized == false
  AddedTokenMatcher normalized_matcher;  // with normalized == true
  StringMap added_by_content;

  bool nfc = false;
  const icu::Normalizer2* nfc_instance = nullptr;
  std::vector<Regex> splits;  // applied in order, then the bytes are merged

  std::optional<std::int32_t> eos, bos;
  std::int64_t size = 0;

  // Pre-token cache: raw bytes -> ids.
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>, StringHash, std::equal_to<>> cache;
  static constexpr std::size_t kCacheCapacity = 1u << 17;
  static constexpr std::size_t kCacheMaxBytes = 256;

  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }

  void set_id(std::int32_t id, std::string bytes, bool added_token) {
    REMAT_CHECK(id >= 0, Error, what, ": negative id ", id);
    const auto i = static_cast<std::size_t>(id);
    if (i >= id_bytes.size()) {
      id_bytes.resize(i + 1);
      defined.resize(i + 1, false);
      is_added.resize(i + 1, false);
    }
    id_bytes[i] = std::move(bytes);
    defined[i] = true;
    if (added_token) is_added[i] = true;
  }

  std::optional<std::int32_t> vocab_id(const std::string& byte_level_text) const {
    if (auto raw = byte_level_to_raw(byte_level_text)) {
      if (auto it = raw_vocab.find(*raw); it != raw_vocab.end()) return it->second;
      return std::nullopt;
    }
    if (auto it = other_vocab.find(byte_level_text); it != other_vocab.end()) return it->second;
    return std::nullopt;
  }

  // ---- loading ----

  void load_model(const Json& model) {
    const std::string where = what + ": model";
    const std::string type = type_of(model, where);
    REMAT_CHECK(type == "BPE", Error, where, ".type is ", Json::quote(type), "; only \"BPE\" is supported");
    REMAT_CHECK(!model.has("dropout") || model.at("dropout").is_null(), Error, where,
                ".dropout is not supported (expected null)");
    REMAT_CHECK(!bool_or(model, "byte_fallback", false, where), Error, where, ".byte_fallback is not supported");
    REMAT_CHECK(null_or(model, "continuing_subword_prefix", ""), Error, where,
                ".continuing_subword_prefix is not supported (expected null or \"\")");
    REMAT_CHECK(null_or(model, "end_of_word_suffix", ""), Error, where,
                ".end_of_word_suffix is not supported (expected null or \"\")");
    ignore_merges = bool_or(model, "ignore_merges", false, where);

    const Json& vocab = member(model, "vocab", where);
    REMAT_CHECK(vocab.is_object(), Error, where, ".vocab: expected an object of token -> id");
    byte_id.fill(-1);
    for (const auto& [token, value] : vocab.members()) {
      REMAT_CHECK(value.is_number(), Error, where, ".vocab[", Json::quote(token), "]: expected an id");
      const auto id64 = value.as_int();
      REMAT_CHECK(id64 >= 0 && id64 < kMaxTokenIds, Error, where, ".vocab[", Json::quote(token), "]: id ", id64,
                  " out of range (ids are 0 .. ", kMaxTokenIds - 1, ")");
      const auto id = static_cast<std::int32_t>(id64);
      if (auto raw = byte_level_to_raw(token)) {
        if (raw->size() == 1) byte_id[static_cast<unsigned char>((*raw)[0])] = id;
        set_id(id, *raw, false);
        raw_vocab.emplace(std::move(*raw), id);
      } else {
        set_id(id, token, false);
        other_vocab.emplace(token, id);
      }
    }

    if (model.has("unk_token") && !model.at("unk_token").is_null()) {
      REMAT_CHECK(model.at("unk_token").is_string(), Error, where, ".unk_token: expected a string or null");
      unk_id = vocab_id(model.at("unk_token").as_string());
      REMAT_CHECK(unk_id.has_value(), Error, where, ".unk_token ", Json::quote(model.at("unk_token").as_string()),
                  " is not in the vocab");
    }

    const Json& list = member(model, "merges", where);
    REMAT_CHECK(list.is_array(), Error, where, ".merges: expected an array");
    merges.reserve(list.items().size() * 2);
    std::int32_t rank = 0;
    for (const Json& m : list.items()) {
      std::string a, b;
      if (m.is_string()) {
        const std::string& s = m.as_string();
        const auto space = s.find(' ');
        REMAT_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos, Error, where,
                    ".merges[", rank, "] ", Json::quote(s), ": expected two tokens separated by one space");
        a = s.substr(0, space);
        b = s.substr(space + 1);
      } else {
        REMAT_CHECK(m.is_array() && m.items().size() == 2 && m.items()[0].is_string() && m.items()[1].is_string(),
                    Error, where, ".merges[", rank, "]: expected \"a b\" or [\"a\", \"b\"]");
        a = m.items()[0].as_string();
        b = m.items()[1].as_string();
      }
      const auto ia = vocab_id(a), ib = vocab_id(b), im = vocab_id(a + b);
      REMAT_CHECK(ia && ib && im, Error, where, ".merges[", rank, "] (", Json::quote(a), ", ", Json::quote(b),
                  "): ", !ia ? a : !ib ? b : a + b, " is not in the vocab");
      merges.emplace(pair_key(*ia, *ib), Merge{rank, *im});  // the first (lowest rank) of duplicates wins
      ++rank;
    }
  }

  void load_added_tokens(const Json& root) {
    if (!root.has("added_tokens") || root.at("added_tokens").is_null()) return;
    const Json& list = root.at("added_tokens");
    REMAT_CHECK(list.is_array(), Error, what, ": added_tokens: expected an array");
    for (std::size_t i = 0; i < list.items().size(); ++i) {
      const Json& t = list.items()[i];
      const std::string where = detail::concat(what, ": added_tokens[", i, "]");
      AddedToken a;
      const Json& content = member(t, "content", where);
      REMAT_CHECK(content.is_string() && !content.as_string().empty(), Error, where,
                  ".content: expected a non-empty string");
      a.content = content.as_string();
      const Json& id = member(t, "id", where);
      REMAT_CHECK(id.is_number(), Error, where, ".id: expected an id");
      REMAT_CHECK(id.as_int() >= 0 && id.as_int() < kMaxTokenIds, Error, where, ".id: ", id.as_int(),
                  " out of range (ids are 0 .. ", kMaxTokenIds - 1, ")");
      a.id = static_cast<std::int32_t>(id.as_int());
      a.special = bool_or(t, "special", false, where);
      a.single_word = bool_or(t, "single_word", false, where);
      a.lstrip = bool_or(t, "lstrip", false, where);
      a.rstrip = bool_or(t, "rstrip", false, where);
      // HF's default: special tokens are not normalized, others are.
      a.normalized = bool_or(t, "normalized", !a.special, where);
      set_id(a.id, a.content, true);
      added_by_content[a.content] = a.id;
      added.push_back(std::move(a));
    }
    for (std::size_t i = 0; i < added.size(); ++i)
      (added[i].normalized && nfc ? normalized_matcher : raw_matcher).add(added[i], i);
  }

  void load_normalizer(const Json& root) {
    if (!root.has("normalizer") || root.at("normalizer").is_null()) return;
    const Json& n = root.at("normalizer");
    const std::string where = what + ": normalizer";
    const std::string type = type_of(n, where);
    if (type == "Sequence") {
      const Json& list = member(n, "normalizers", where);
      REMAT_CHECK(list.is_array(), Error, where, ".normalizers: expected an array");
      for (const Json& item : list.items()) {
        const std::string t = type_of(item, where + ".normalizers[]");
        REMAT_CHECK(t == "NFC", Error, where, ".normalizers[] type ", Json::quote(t),
                    " is not supported (only NFC)");
        nfc = true;
      }
    } else {
      REMAT_CHECK(type == "NFC", Error, where, ".type ", Json::quote(type),
                  " is not supported (null, NFC or a Sequence of NFC)");
      nfc = true;
    }
    if (nfc) {
      UErrorCode status = U_ZERO_ERROR;
      nfc_instance = icu::Normalizer2::getNFCInstance(status);
      REMAT_CHECK(U_SUCCESS(status) && nfc_instance != nullptr, Error, where, ": ICU's NFC normalizer is unavailable: ",
                  u_errorName(status));
    }
  }

  void load_split(const Json& split, const std::string& where) {
    const std::string behavior = member(split, "behavior", where).is_string()
                                     ? split.at("behavior").as_string()
                                     : std::string("(not a string)");
    REMAT_CHECK(behavior == "Isolated", Error, where, ".behavior ", Json::quote(behavior),
                " is not supported (only \"Isolated\")");
    REMAT_CHECK(!bool_or(split, "invert", false, where), Error, where, ".invert true is not supported");
    const Json& pattern = member(split, "pattern", where);
    REMAT_CHECK(pattern.is_object(), Error, where, ".pattern: expected {\"Regex\": ...} or {\"String\": ...}");
    if (pattern.has("Regex") && pattern.at("Regex").is_string())
      splits.emplace_back(pattern.at("Regex").as_string(), where);
    else if (pattern.has("String") && pattern.at("String").is_string())
      splits.emplace_back(escape_literal(pattern.at("String").as_string()), where);
    else
      throw Error(where + ".pattern: expected {\"Regex\": ...} or {\"String\": ...}");
  }

  void load_byte_level(const Json& bl, const std::string& where) {
    REMAT_CHECK(!bool_or(bl, "add_prefix_space", false, where), Error, where,
                ".add_prefix_space true is not supported");
    if (bool_or(bl, "use_regex", true, where)) splits.emplace_back(kGpt2Pattern, where);
  }

  void load_pre_tokenizer(const Json& root) {
    const std::string where = what + ": pre_tokenizer";
    REMAT_CHECK(root.has("pre_tokenizer") && !root.at("pre_tokenizer").is_null(), Error, where,
                " is null; only byte-level pre-tokenization is supported");
    const Json& p = root.at("pre_tokenizer");
    const std::string type = type_of(p, where);
    if (type == "ByteLevel") {
      load_byte_level(p, where);
      return;
    }
    REMAT_CHECK(type == "Sequence", Error, where, ".type ", Json::quote(type),
                " is not supported (ByteLevel, or a Sequence of Split and ByteLevel)");
    const Json& list = member(p, "pretokenizers", where);
    REMAT_CHECK(list.is_array(), Error, where, ".pretokenizers: expected an array");
    bool byte_level = false;
    for (std::size_t i = 0; i < list.items().size(); ++i) {
      const Json& step = list.items()[i];
      const std::string w = detail::concat(where, ".pretokenizers[", i, "]");
      const std::string t = type_of(step, w);
      REMAT_CHECK(!byte_level, Error, w, ": ", Json::quote(t), " after ByteLevel is not supported");
      if (t == "Split") {
        load_split(step, w);
      } else if (t == "ByteLevel") {
        load_byte_level(step, w);
        byte_level = true;
      } else {
        throw Error(detail::concat(w, ".type ", Json::quote(t), " is not supported (Split or ByteLevel)"));
      }
    }
    REMAT_CHECK(byte_level, Error, where, ": a Sequence without ByteLevel is not supported");
  }

  void load_decoder(const Json& root) {
    if (!root.has("decoder") || root.at("decoder").is_null()) return;
    const std::string type = type_of(root.at("decoder"), what + ": decoder");
    REMAT_CHECK(type == "ByteLevel", Error, what, ": decoder.type ", Json::quote(type),
                " is not supported (only ByteLevel)");
  }

  // An id from a tokenizer_config.json entry: a string, {"content": ...} or null.
  std::optional<std::int32_t> config_token(const Json& config, const std::string& key, const std::string& where,
                                           bool& present) const {
    present = config.has(key);
    if (!present || config.at(key).is_null()) return std::nullopt;
    const Json& v = config.at(key);
    std::string content;
    if (v.is_string())
      content = v.as_string();
    else if (v.is_object() && v.has("content") && v.at("content").is_string())
      content = v.at("content").as_string();
    else
      throw Error(detail::concat(where, ".", key, ": expected a string, {\"content\": ...} or null"));
    if (auto it = added_by_content.find(content); it != added_by_content.end()) return it->second;
    auto id = vocab_id(content);
    REMAT_CHECK(id.has_value(), Error, where, ".", key, " ", Json::quote(content), " is not a token of ", what);
    return id;
  }

  void load_special_ids(const std::optional<std::string>& config_json) {
    bool eos_set = false, bos_set = false;
    if (config_json) {
      const std::string where = what + ": tokenizer_config.json";
      const Json config = Json::parse(*config_json, where);
      REMAT_CHECK(config.is_object(), Error, where, ": expected an object");
      eos = config_token(config, "eos_token", where, eos_set);
      bos = config_token(config, "bos_token", where, bos_set);
    }
    auto first_added = [&](std::initializer_list<const char*> names) -> std::optional<std::int32_t> {
      for (const char* name : names)
        if (auto it = added_by_content.find(std::string_view(name)); it != added_by_content.end()) return it->second;
      return std::nullopt;
    };
    if (!eos_set) eos = first_added({"<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "</s>"});
    if (!bos_set) bos = first_added({"<|begin_of_text|>", "<s>"});
  }

  // ---- encoding ----

  // Splits `text` on the added tokens of `matcher`, appending to `out`.
  void split_added(std::string_view text, const AddedTokenMatcher& matcher, std::vector<Segment>& out) const {
    if (matcher.empty()) {
      if (!text.empty()) out.push_back({text, -1});
      return;
    }
    std::size_t plain_start = 0;  // start of the text not yet emitted
    std::size_t i = 0;
    while (i < text.size()) {
      const auto [index, length] = matcher.longest_at(text, i);
      if (index < 0) {
        ++i;
        continue;
      }
      const AddedToken& token = added[static_cast<std::size_t>(index)];
      std::size_t begin = i, end = i + length;
      if (token.single_word && ((begin > 0 && is_word_char(char_before(text, begin))) ||
                                (end < text.size() && is_word_char(char_at(text, end))))) {
        ++i;
        continue;
      }
      if (token.lstrip)
        while (begin > plain_start && is_white_space(char_before(text, begin))) {
          const UChar32 c = char_before(text, begin);
          begin -= static_cast<std::size_t>(U8_LENGTH(c));
        }
      if (token.rstrip)
        while (end < text.size() && is_white_space(char_at(text, end)))
          end += static_cast<std::size_t>(U8_LENGTH(char_at(text, end)));
      if (begin > plain_start) out.push_back({text.substr(plain_start, begin - plain_start), -1});
      out.push_back({{}, token.id});
      plain_start = i = end;
    }
    if (plain_start < text.size()) out.push_back({text.substr(plain_start), -1});
  }

  // The NFC form of `text` (valid UTF-8) in `storage`, or `text` itself when
  // it is already normalized.
  std::string_view normalize(std::string_view text, std::string& storage) const {
    if (!nfc || is_ascii(text)) return text;
    UErrorCode status = U_ZERO_ERROR;
    const icu::StringPiece piece(text.data(), static_cast<std::int32_t>(text.size()));
    if (nfc_instance->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return text;
    status = U_ZERO_ERROR;
    storage.clear();
    icu::StringByteSink<std::string> sink(&storage);
    nfc_instance->normalizeUTF8(0, piece, sink, nullptr, status);
    REMAT_CHECK(U_SUCCESS(status), Error, what, ": NFC normalization failed: ", u_errorName(status));
    return storage;
  }

  // Appends the ids of one pre-token's bytes.
  void encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const {
    if (piece.empty()) return;
    if (piece.size() == 1) {
      const std::int32_t id = byte_id[static_cast<unsigned char>(piece[0])];
      if (id >= 0)
        out.push_back(id);
      else if (unk_id)
        out.push_back(*unk_id);
      return;
    }
    if (ignore_merges)
      if (auto it = raw_vocab.find(piece); it != raw_vocab.end()) {
        out.push_back(it->second);
        return;
      }
    const bool cacheable = piece.size() <= kCacheMaxBytes;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mutex);
      if (auto it = cache.find(piece); it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<std::int32_t> ids = merge(piece);
    out.insert(out.end(), ids.begin(), ids.end());
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mutex);
      if (cache.size() >= kCacheCapacity) cache.clear();
      cache.emplace(std::string(piece), std::move(ids));
    }
  }

  // BPE on the bytes of `piece`: repeatedly merges the adjacent pair of
  // lowest rank (leftmost among equals), as HF's Word::merge_all does.
  std::vector<std::int32_t> merge(std::string_view piece) const {
    struct Symbol {
      std::int32_t id;
      std::int32_t prev;
      std::int32_t next;
      bool alive;
    };
    std::vector<Symbol> symbols;
    symbols.reserve(piece.size());
    for (char c : piece) {
      std::int32_t id = byte_id[static_cast<unsigned char>(c)];
      if (id < 0) {
        if (!unk_id) continue;  // HF drops a character with no token when there is no unk
        id = *unk_id;
      }
      const auto n = static_cast<std::int32_t>(symbols.size());
      symbols.push_back({id, n - 1, n + 1, true});
    }
    if (symbols.empty()) return {};
    symbols.back().next = -1;

    struct Candidate {
      std::int32_t rank;
      std::int32_t pos;
      std::int32_t new_id;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
    auto consider = [&](std::int32_t pos) {
      const std::int32_t next = symbols[static_cast<std::size_t>(pos)].next;
      if (next < 0) return;
      auto it = merges.find(pair_key(symbols[static_cast<std::size_t>(pos)].id, symbols[static_cast<std::size_t>(next)].id));
      if (it != merges.end()) queue.push({it->second.rank, pos, it->second.new_id});
    };
    for (std::int32_t i = 0; i + 1 < static_cast<std::int32_t>(symbols.size()); ++i) consider(i);

    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& left = symbols[static_cast<std::size_t>(top.pos)];
      if (!left.alive || left.next < 0) continue;
      Symbol& right = symbols[static_cast<std::size_t>(left.next)];
      auto it = merges.find(pair_key(left.id, right.id));
      if (it == merges.end() || it->second.new_id != top.new_id) continue;  // stale
      left.id = top.new_id;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) symbols[static_cast<std::size_t>(right.next)].prev = top.pos;
      if (left.prev >= 0) consider(left.prev);
      consider(top.pos);
    }
    std::vector<std::int32_t> ids;
    for (std::int32_t i = 0; i >= 0; i = symbols[static_cast<std::size_t>(i)].next)
      ids.push_back(symbols[static_cast<std::size_t>(i)].id);
    return ids;
  }

  // Pre-tokenizes `text` (valid UTF-8) and appends the ids of its pieces.
  void encode_plain(std::string_view text, std::vector<std::int32_t>& out, std::vector<MatchData>& match_data) const {
    if (splits.empty()) {
      encode_piece(text, out);
      return;
    }
    // Each split step refines the pieces of the one before.
    std::vector<std::string_view> pieces{text}, next;
    for (std::size_t s = 0; s < splits.size(); ++s) {
      next.clear();
      for (std::string_view piece : pieces) {
        std::size_t pos = 0, begin = 0, end = 0;
        while (pos < piece.size() && splits[s].find(piece, pos, match_data[s].get(), begin, end)) {
          if (end == begin) {  // an empty match: step over one character
            const UChar32 c = char_at(piece, begin);
            const std::size_t step = c < 0 ? 1 : static_cast<std::size_t>(U8_LENGTH(c));
            if (begin > pos) next.push_back(piece.substr(pos, begin - pos));
            next.push_back(piece.substr(begin, step));
            pos = begin + step;
            continue;
          }
          if (begin > pos) next.push_back(piece.substr(pos, begin - pos));
          next.push_back(piece.substr(begin, end - begin));
          pos = end;
        }
        if (pos < piece.size()) next.push_back(piece.substr(pos));
      }
      pieces.swap(next);
    }
    for (std::string_view piece : pieces) encode_piece(piece, out);
  }

  std::vector<std::int32_t> encode(std::string_view input) const {
    std::string valid_storage;
    std::string_view text = input;
    if (!tokenizer_detail::valid_utf8(input)) text = valid_storage = replace_invalid_utf8(input);
    std::vector<MatchData> match_data;
    match_data.reserve(splits.size());
    for (const Regex& r : splits) match_data.push_back(r.match_data());

    std::vector<std::int32_t> out;
    out.reserve(text.size() / 3 + 1);
    std::vector<Segment> raw_segments, segments;
    split_added(text, raw_matcher, raw_segments);
    std::string normalized;
    for (const Segment& seg : raw_segments) {
      if (seg.added_id >= 0) {
        out.push_back(seg.added_id);
        continue;
      }
      const std::string_view norm = normalize(seg.text, normalized);
      segments.clear();
      split_added(norm, normalized_matcher, segments);
      for (const Segment& s : segments) {
        if (s.added_id >= 0)
          out.push_back(s.added_id);
        else
          encode_plain(s.text, out, match_data);
      }
    }
    return out;
  }

  std::string decode(const std::vector<std::int32_t>& ids) const {
    std::string out, run;
    for (std::int32_t id : ids) {
      REMAT_CHECK(id >= 0 && static_cast<std::size_t>(id) < defined.size() && defined[static_cast<std::size_t>(id)],
                  Error, what, ": decode: id ", id, " is not in the vocabulary (size ", size, ")");
      const auto i = static_cast<std::size_t>(id);
      if (is_added[i]) {
        out += replace_invalid_utf8(run);
        run.clear();
        out += id_bytes[i];
      } else {
        run += id_bytes[i];
      }
    }
    out += replace_invalid_utf8(run);
    return out;
  }
};

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::~BpeTokenizer() = default;

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_json(const std::string& tokenizer_json,
                                                      const std::optional<std::string>& config_json,
                                                      const std::string& what) {
  auto impl = std::make_unique<Impl>();
  impl->what = what;
  impl->hash = tokenizer_detail::xxh3_hex(tokenizer_json);
  const Json root = Json::parse(tokenizer_json, what);
  REMAT_CHECK(root.is_object(), Error, what, ": expected a tokenizer.json object");
  impl->load_model(member(root, "model", what));
  impl->load_normalizer(root);
  impl->load_added_tokens(root);
  impl->load_pre_tokenizer(root);
  impl->load_decoder(root);
  impl->size = static_cast<std::int64_t>(impl->defined.size());
  impl->load_special_ids(config_json);
  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_file(const std::string& path) {
  const std::string text = read_file(path, "a tokenizer.json");
  std::optional<std::string> config;
  const auto config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(config_path, ec)) config = read_file(config_path.string(), "a tokenizer_config.json");
  return from_json(text, config, path);
}

std::vector<std::int32_t> BpeTokenizer::encode(std::string_view text) const { return impl_->encode(text); }
std::string BpeTokenizer::decode(const std::vector<std::int32_t>& ids) const { return impl_->decode(ids); }
std::int64_t BpeTokenizer::vocab_size() const { return impl_->size; }
std::optional<std::int32_t> BpeTokenizer::eos_id() const { return impl_->eos; }
std::optional<std::int32_t> BpeTokenizer::bos_id() const { return impl_->bos; }
std::string BpeTokenizer::hash() const { return impl_->hash; }

std::optional<std::int32_t> BpeTokenizer::token_id(const std::string& text) const {
  if (auto it = impl_->added_by_content.find(text); it != impl_->added_by_content.end()) return it->second;
  return impl_->vocab_id(text);
}

}  // namespace remat
