#include "engine/parallel_for.h"

#include <omp.h>

#include <algorithm>

#include "engine/error.h"

namespace remat {

int num_threads() { return omp_get_max_threads(); }

void set_num_threads(int n) {
  REMAT_CHECK(n >= 1, Error, "set_num_threads: expected n >= 1, got ", n);
  omp_set_num_threads(n);
}

void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& fn) {
  const std::int64_t n = end - begin;
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const std::int64_t chunks = std::min<std::int64_t>(threads, (n + grain - 1) / grain);
  if (chunks <= 1) {
    fn(begin, end);
    return;
  }
  const std::int64_t step = (n + chunks - 1) / chunks;
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t b = begin + c * step;
    const std::int64_t e = std::min(end, b + step);
    if (b < e) fn(b, e);
  }
}

}  // namespace remat
