// ./remat tokenize: text to token shards (train/token_shards.h) for `train
// --data`, or ids as JSON on stdout (--json), or JSON ids back to text
// (--decode).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "engine/error.h"
#include "engine/json.h"
#include "tokenizer/tokenizer.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "train/token_shards.h"

namespace remat::tools {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REMAT_CHECK(in.good(), IOError, "tokenize: cannot read ", path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REMAT_CHECK(!in.bad(), IOError, "tokenize: reading ", path, " failed");
  return s;
}

// The documents of --data: a file is one, a folder's regular files (sorted by
// path, hidden ones skipped, recursively) one each.
std::vector<std::string> data_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    REMAT_CHECK(fs::is_regular_file(path, ec), IOError, "tokenize: --data ", path, " is neither a file nor a folder");
    return {path};
  }
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator(path, ec); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  REMAT_CHECK(!files.empty(), IOError, "tokenize: --data ", path, " holds no files");
  return files;
}

// --field: JSON Lines.

const char* type_with_article(Json::Type t) {
  switch (t) {
    case Json::Type::null: return "null";
    case Json::Type::boolean: return "a boolean";
    case Json::Type::number: return "a number";
    case Json::Type::string: return "a string";
    case Json::Type::array: return "an array";
    case Json::Type::object: return "an object";
  }
  return "?";
}

// The keys of `object` for an error message: quoted, in sorted order, at most
// 8 of them, each cut at 40 bytes.
std::string key_list(const Json& object) {
  if (object.members().empty()) return "none";
  constexpr std::size_t kKeys = 8, kBytes = 40;
  std::string out;
  std::size_t n = 0;
  for (const auto& [key, value] : object.members()) {
    if (n == kKeys) {
      out += ", ... (" + std::to_string(object.members().size()) + " in all)";
      break;
    }
    out += (n++ ? ", " : "") + Json::quote(key.size() > kBytes ? key.substr(0, kBytes) + "..." : key);
  }
  return out;
}

// One line of a JSON Lines file; `where` is "tokenize: FILE line N".
// Json::parse says "WHAT: malformed JSON at offset O (line L, column C):
// REASON"; of a single line the column and the reason are what matter.
Json parse_line(const std::string& line, const std::string& where) {
  try {
    return Json::parse(line, where);
  } catch (const IOError& e) {
    const std::string msg = e.what();
    const std::string marker = "(line 1, column ";
    const std::size_t at = msg.find(marker), close = msg.find("): ", at);
    const bool known = msg.starts_with(where + ": malformed JSON") && at != std::string::npos &&
                       close != std::string::npos;
    const std::string detail =
        known ? "column " + msg.substr(at + marker.size(), close - at - marker.size()) + ": " + msg.substr(close + 3)
              : msg;
    throw IOError(where + " is not valid JSON (" + detail + "); with --field each non-blank line must be one "
                  "JSON object (JSON Lines)");
  }
}

// The document of one line: member `field` of the object, a string.
const std::string& line_document(const Json& j, const std::string& field, const std::string& where) {
  REMAT_CHECK(j.is_object(), IOError, where, " is ", type_with_article(j.type()),
              ", not a JSON object (with --field each non-blank line must be one JSON object)");
  REMAT_CHECK(j.has(field), IOError, where, " has no member ", Json::quote(field), " (its keys: ", key_list(j), ")");
  const Json& v = j.at(field);
  REMAT_CHECK(v.is_string(), IOError, where, ": member ", Json::quote(field), " is ", type_with_article(v.type()),
              ", not a string");
  return v.as_string();
}

// Calls `fn(document, end)` for each non-blank line (only spaces, tabs and
// carriage returns: blank) of `text`, the JSON Lines file `path`: the line's
// document, and the offset in `text` where the line ends. Throws IOError
// naming the file and the line on the first bad one.
template <class Fn>
void for_each_line_document(const std::string& path, const std::string& text, const std::string& field, Fn&& fn) {
  std::size_t start = 0;
  for (std::int64_t number = 1; start < text.size(); ++number) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "tokenize: " + path + " line " + std::to_string(number);
    const Json j = parse_line(line, where);
    fn(line_document(j, field, where), end);
  }
}

// Checks every line of every file before a shard is written, so that a bad
// line leaves --out empty.
void check_json_lines(const std::vector<std::string>& files, const std::string& field) {
  for (const auto& path : files)
    for_each_line_document(path, read_file(path), field, [](const std::string&, std::size_t) {});
}

int run_decode(const Flags& f, const Tokenizer& tok) {
  const std::string path = f.get("data");
  std::string text;
  if (path == "-") {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    text = ss.str();
  } else {
    text = read_file(path);
  }
  const Json j = Json::parse(text, "tokenize --decode input");
  std::vector<std::int32_t> ids;
  for (const Json& v : j.items()) {
    const double d = v.as_number();
    REMAT_CHECK(d >= 0 && d < double(tok.vocab_size()) && d == std::floor(d), Error, "tokenize --decode: id ", d,
                " is not a token of this tokenizer (0 .. ", tok.vocab_size() - 1, ")");
    ids.push_back(std::int32_t(d));
  }
  const std::string out = tok.decode(ids);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int run_json(const Flags& f, const Tokenizer& tok) {
  const auto ids = tok.encode(read_file(f.get("data")));
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  std::printf("%s]\n", out.c_str());
  return 0;
}

// --out: every file one document, or with --field every line of every file.
int write_shards(const Flags& f, const Tokenizer& tok) {
  const auto files = data_files(f.get("data"));
  const std::string field = f.get("field");  // "": plain text
  std::uintmax_t total = 0, done = 0;
  for (const auto& p : files) total += std::filesystem::file_size(p);
  const auto eos = tok.eos_id();
  ShardWriter w(f.get("out"), tok.vocab_size(), tok.hash(), eos ? *eos : -1, f.get_int("shard-tokens"));
  if (!field.empty()) {
    std::fprintf(stderr, "tokenize: checking the JSON Lines of %zu file%s (%.1f MB)\n", files.size(),
                 files.size() == 1 ? "" : "s", double(total) / 1e6);
    check_json_lines(files, field);
  }
  const auto t0 = std::chrono::steady_clock::now();
  double seconds = 0, shown = -1;
  auto progress = [&](std::size_t file, std::uintmax_t bytes, bool force) {
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!force && seconds < shown + 0.25) return;
    shown = seconds;
    std::fprintf(stderr, "\rtokenize: %zu/%zu files, %.1f of %.1f MB, %lld tokens, %.1f MB/s", file, files.size(),
                 double(bytes) / 1e6, double(total) / 1e6, static_cast<long long>(w.tokens()),
                 seconds > 0 ? double(bytes) / 1e6 / seconds : 0.0);
    std::fflush(stderr);
  };
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string text = read_file(files[i]);
    if (field.empty()) {
      w.add_document(tok.encode(text));
    } else {
      for_each_line_document(files[i], text, field, [&](const std::string& doc, std::size_t end) {
        w.add_document(tok.encode(doc));
        progress(i, done + end, false);
      });
    }
    done += text.size();
    progress(i + 1, done, true);
  }
  w.close();
  std::fprintf(stderr, "\n");
  std::printf("tokenize: %lld documents, %lld tokens (%d-byte ids, vocabulary %lld, tokenizer %s) in %zu shard%s "
              "under %s; %.1f MB of %s at %.1f MB/s\n",
              static_cast<long long>(w.documents()), static_cast<long long>(w.tokens()), w.token_bytes(),
              static_cast<long long>(tok.vocab_size()), tok.hash().c_str(), w.files().size(),
              w.files().size() == 1 ? "" : "s", f.get("out").c_str(), double(done) / 1e6,
              field.empty() ? "text" : "JSON Lines", seconds > 0 ? double(done) / 1e6 / seconds : 0.0);
  return 0;
}

}  // namespace

int run_tokenize(const std::vector<std::string>& args) {
  Flags f("tokenize", "text to token shards for train --data (or ids as JSON, or ids back to text)", args,
          {text_flag("tokenizer", "tokenizer.json (byte-level BPE), a SentencePiece .model, or a folder with one "
                     "(required)"),
           text_flag("data", "a text file, or a folder of them (one document per file; with --field JSON Lines files); "
                     "with --decode a JSON array of ids ('-': stdin)"),
           text_flag("out", "write shards into this folder (new or empty)"),
           text_flag("field", "read --data as JSON Lines: each non-blank line an object whose string member NAME "
                     "is one document (with --out)"),
           bool_flag("json", "print the ids of --data (one file) as a JSON array on stdout, no special tokens added"),
           bool_flag("decode", "read a JSON array of ids from --data and print the text"),
           int_flag("shard-tokens", "tokens per shard file", std::int64_t(1) << 28, {.min = 1024})});
  REMAT_CHECK(f.has("tokenizer"), Error, "tokenize: --tokenizer T is required");
  REMAT_CHECK(f.has("data"), Error, "tokenize: --data FILE|DIR is required");
  const int modes = int(f.has("out")) + int(f.get_bool("json")) + int(f.get_bool("decode"));
  REMAT_CHECK(modes == 1, Error, "tokenize: give exactly one of --out DIR, --json, --decode");
  REMAT_CHECK(!f.has("field") || f.has("out"), Error,
              "tokenize: --field NAME reads JSON Lines into shards: give it with --out DIR, not --json or --decode");
  REMAT_CHECK(!f.has("field") || !f.get("field").empty(), Error, "tokenize: --field needs the member's name");
  const auto tok = load_tokenizer(f.get("tokenizer"));
  if (f.get_bool("decode")) return run_decode(f, *tok);
  if (f.get_bool("json")) return run_json(f, *tok);
  return write_shards(f, *tok);
}

}  // namespace remat::tools
