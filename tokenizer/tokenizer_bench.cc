// Encoding speed of a tokenizer on a text file, on one thread:
//
//   tokenizer_bench TOKENIZER TEXT [REPEATS]
//
// Loads TOKENIZER (as load_tokenizer does), reads TEXT, and encodes it
// REPEATS times (default 3) line by line, as a data loader would, and once
// whole. The first pass starts with an empty pre-token cache (cold); the
// others reuse it (warm). Prints MB/s (10^6 bytes) for each and the id count.
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenizer_bench TOKENIZER TEXT [REPEATS]\n");
    return 2;
  }
  try {
    const int repeats = argc > 3 ? std::stoi(argv[3]) : 3;
    auto t0 = std::chrono::steady_clock::now();
    const auto tok = remat::load_tokenizer(argv[1]);
    std::printf("loaded %s (%s, vocab %lld, hash %s) in %.2f s\n", argv[1], tok->kind().c_str(),
                static_cast<long long>(tok->vocab_size()), tok->hash().c_str(), seconds_since(t0));
    const std::string text = remat::tokenizer_detail::read_file(argv[2], "a text file");
    std::vector<std::string_view> lines;
    for (std::size_t pos = 0; pos < text.size();) {
      std::size_t end = text.find('\n', pos);
      end = end == std::string::npos ? text.size() : end + 1;
      lines.push_back(std::string_view(text).substr(pos, end - pos));
      pos = end;
    }
    const double mb = static_cast<double>(text.size()) / 1e6;
    for (int r = 0; r < repeats; ++r) {
      t0 = std::chrono::steady_clock::now();
      std::size_t ids = 0;
      for (std::string_view line : lines) ids += tok->encode(line).size();
      const double s = seconds_since(t0);
      std::printf("pass %d (%s cache), line by line: %.3f MB in %.3f s = %.2f MB/s, %zu ids\n", r + 1,
                  r == 0 ? "cold" : "warm", mb, s, mb / s, ids);
    }
    t0 = std::chrono::steady_clock::now();
    const std::size_t ids = tok->encode(text).size();
    const double s = seconds_since(t0);
    std::printf("whole text at once: %.3f MB in %.3f s = %.2f MB/s, %zu ids\n", mb, s, mb / s, ids);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
