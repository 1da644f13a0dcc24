// The execution order of ./remat bench: which variant (a plan, or the
// PyTorch baseline) runs in which fresh process. Variants interleave in a
// balanced order so that drift of the machine over the run (frequency,
// other load, thermal state) lands on every variant alike instead of on the
// ratios between them.
#pragma once

#include <cstdint>
#include <vector>

namespace remat::tools {

// One process of a bench run.
struct BenchSlot {
  std::int64_t repeat = 0;    // 0-based repeat of the variant
  std::int64_t variant = 0;   // index into the bench's variant list
  std::int64_t position = 0;  // 0-based index in the whole execution order
  std::int64_t slot = 0;      // 0-based index within its round
};

// Every variant once per round, `repeats` rounds, rounds in the rows of a
// Williams design (Williams 1949, "Experimental designs balanced for the
// estimation of residual effects of treatments"): over a complete design
// (n rounds for an even n, 2n for an odd n) every variant takes every slot
// equally often and follows every other variant equally often. Two variants
// give ABBA. Requires n_variants >= 1, repeats >= 1.
std::vector<BenchSlot> bench_order(std::int64_t n_variants, std::int64_t repeats);

}  // namespace remat::tools
