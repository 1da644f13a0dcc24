// CPU parallelism: one OpenMP thread team shared by engine kernels and Eigen's
// GEMM, so the two never oversubscribe the cores.
#pragma once

#include <cstdint>
#include <functional>

namespace remat {

// Threads CPU kernels use (default: OMP_NUM_THREADS, else the core count).
int num_threads();
// Sets the thread count for CPU kernels and Eigen (n >= 1).
void set_num_threads(int n);

// Runs fn(chunk_begin, chunk_end) over [begin, end) split into chunks of at
// least `grain` items, in parallel when there is more than one chunk and the
// caller is not already inside a parallel region. Chunk boundaries depend only
// on (begin, end, grain, thread count); fn must not depend on which thread runs it.
void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& fn);

}  // namespace remat
