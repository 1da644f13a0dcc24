// What the model tests share besides configs: a seeded batch of token ids
// and a bitwise comparison of flattened values.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/rng.h"
#include "engine/tensor.h"

namespace remat::testing {

// Token ids [rows, cols] in [0, vocab), from a seed.
inline Tensor token_ids(std::int64_t rows, std::int64_t cols, std::int64_t vocab, std::uint64_t seed) {
  Generator g(seed);
  std::vector<std::int64_t> v;
  for (float x : rand({rows, cols}, DType::f32, &g).to_vector<float>())
    v.push_back(std::min<std::int64_t>(std::int64_t(x * float(vocab)), vocab - 1));
  return from_vector<std::int64_t>(v, {rows, cols});
}

// The same number of floats with the same bits.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace remat::testing
