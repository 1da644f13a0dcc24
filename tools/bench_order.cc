#include "tools/bench_order.h"

#include "engine/error.h"

namespace remat::tools {

std::vector<BenchSlot> bench_order(std::int64_t n, std::int64_t repeats) {
  REMAT_CHECK(n >= 1 && repeats >= 1, Error, "bench_order: needs at least one variant and one repeat, got ", n,
              " variants and ", repeats, " repeats");
  // The first row 0, 1, n-1, 2, n-2, ...; row r adds r (mod n). For an odd n
  // the rows n..2n-1 are rows 0..n-1 reversed.
  std::vector<std::int64_t> first(static_cast<std::size_t>(n));
  for (std::int64_t j = 0, lo = 1, hi = n - 1; j < n; ++j)
    first[std::size_t(j)] = j == 0 ? 0 : (j % 2 == 1 ? lo++ : hi--);
  const std::int64_t rows = n % 2 == 0 ? n : 2 * n;
  std::vector<BenchSlot> out;
  for (std::int64_t r = 0; r < repeats; ++r) {
    const std::int64_t row = r % rows;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t k = row < n ? j : n - 1 - j;
      BenchSlot s;
      s.repeat = r;
      s.variant = (first[std::size_t(k)] + row % n) % n;
      s.position = std::int64_t(out.size());
      s.slot = j;
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace remat::tools
