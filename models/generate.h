// Sampling text from a decoder with its KV cache (DecoderModel::
// forward_cached): the prompt is prefilled once, then one token at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "models/decoder.h"

namespace remat {

struct GenerateOptions {
  std::int64_t max_new = 64;     // tokens to produce (at most)
  double temperature = 1.0;      // 0: greedy (argmax; ties: the lowest id)
  std::int64_t top_k = 0;        // keep the k most likely (0: all)
  double top_p = 1.0;            // keep the smallest set whose probability reaches p (1: all)
  std::uint64_t seed = 0;        // the sampling stream (Philox, one draw per token)
  std::optional<std::int32_t> stop;  // end after producing this token (e.g. EOS), included
};

// Produces up to opts.max_new tokens after `prompt` (at least one id, each in
// [0, vocab)), calling on_token (if set) with each as it is chosen. Returns
// the new tokens. Throws Error for a bad option or prompt (naming it).
std::vector<std::int32_t> generate(const DecoderModel& model, const std::vector<std::int32_t>& prompt,
                                   const GenerateOptions& opts,
                                   const std::function<void(std::int32_t)>& on_token = nullptr);

// Greedy decoding without the cache: the whole sequence through forward()
// for every new token. The reference the cached path is tested against.
std::vector<std::int32_t> generate_greedy_uncached(const DecoderModel& model, const std::vector<std::int32_t>& prompt,
                                                   std::int64_t max_new);

// The token chosen from one row of logits under opts (temperature, top-k,
// top-p) with the uniform draw u in [0, 1).
std::int32_t sample_token(const std::vector<float>& logits, const GenerateOptions& opts, float u);

}  // namespace remat
