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

}  // namespace

int run_tokenize(const std::vector<std::string>& args) {
  Flags f("tokenize", "text to token shards for train --data (or ids as JSON, or ids back to text)", args,
          {text_flag("tokenizer", "tokenizer.json (byte-level BPE), a SentencePiece .model, or a folder with one "
                     "(required)"),
           text_flag("data", "a text file, or a folder of them (one document per file); with --decode a JSON array "
                     "of ids ('-': stdin)"),
           text_flag("out", "write shards into this folder (new or empty)"),
           bool_flag("json", "print the ids of --data (one file) as a JSON array on stdout, no special tokens added"),
           bool_flag("decode", "read a JSON array of ids from --data and print the text"),
           int_flag("shard-tokens", "tokens per shard file", std::int64_t(1) << 28, {.min = 1024})});
  REMAT_CHECK(f.has("tokenizer"), Error, "tokenize: --tokenizer T is required");
  REMAT_CHECK(f.has("data"), Error, "tokenize: --data FILE|DIR is required");
  const int modes = int(f.has("out")) + int(f.get_bool("json")) + int(f.get_bool("decode"));
  REMAT_CHECK(modes == 1, Error, "tokenize: give exactly one of --out DIR, --json, --decode");
  const auto tok = load_tokenizer(f.get("tokenizer"));

  if (f.get_bool("decode")) {
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
      REMAT_CHECK(d >= 0 && d < double(tok->vocab_size()) && d == std::floor(d), Error, "tokenize --decode: id ", d,
                  " is not a token of this tokenizer (0 .. ", tok->vocab_size() - 1, ")");
      ids.push_back(std::int32_t(d));
    }
    const std::string out = tok->decode(ids);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  if (f.get_bool("json")) {
    const auto ids = tok->encode(read_file(f.get("data")));
    std::string out = "[";
    for (std::size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
    std::printf("%s]\n", out.c_str());
    return 0;
  }

  const auto files = data_files(f.get("data"));
  std::uintmax_t total = 0, done = 0;
  for (const auto& p : files) total += std::filesystem::file_size(p);
  const auto eos = tok->eos_id();
  ShardWriter w(f.get("out"), tok->vocab_size(), tok->hash(), eos ? *eos : -1, f.get_int("shard-tokens"));
  const auto t0 = std::chrono::steady_clock::now();
  double seconds = 0;
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string text = read_file(files[i]);
    w.add_document(tok->encode(text));
    done += text.size();
    seconds = elapsed();
    std::fprintf(stderr, "\rtokenize: %zu/%zu files, %.1f of %.1f MB, %lld tokens, %.1f MB/s", i + 1, files.size(),
                 double(done) / 1e6, double(total) / 1e6, static_cast<long long>(w.tokens()),
                 seconds > 0 ? double(done) / 1e6 / seconds : 0.0);
    std::fflush(stderr);
  }
  w.close();
  std::fprintf(stderr, "\n");
  std::printf("tokenize: %lld documents, %lld tokens (%d-byte ids, vocabulary %lld, tokenizer %s) in %zu shard%s "
              "under %s; %.1f MB of text at %.1f MB/s\n",
              static_cast<long long>(w.documents()), static_cast<long long>(w.tokens()), w.token_bytes(),
              static_cast<long long>(tok->vocab_size()), tok->hash().c_str(), w.files().size(),
              w.files().size() == 1 ? "" : "s", f.get("out").c_str(), double(done) / 1e6,
              seconds > 0 ? double(done) / 1e6 / seconds : 0.0);
  return 0;
}

}  // namespace remat::tools
