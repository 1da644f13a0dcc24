// Compression of saved tensors: a saved-tensor hook that keeps what ops save
// for backward in a smaller format and expands it on unpack (lossy, and
// measured: see tests/checkpoint/compress_test.cc for the bounds).
//
//   bf16  f32 saves kept as bf16 (round to nearest even): half the bytes.
//   fp8   MXFP8 (ops/mxfp8.h): e4m3 values with one power-of-two scale per 32
//         values, about 0.26x of f32 (0.52x of bf16).
//
// The packed value is one Tensor, so a hook further out (offload) moves the
// compressed bytes. Stacks with checkpoint regions: saves a region dropped
// are placeholders and pass by.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>
#include <string>

#include "engine/autograd.h"

namespace remat {

enum class CompressFormat { bf16, fp8 };

// "bf16" or "fp8"; throws Error naming the valid formats otherwise.
CompressFormat compress_format_from_name(const std::string& name);
const char* compress_format_name(CompressFormat f);

struct CompressOptions {
  CompressFormat format = CompressFormat::fp8;
  // Which saves: the inputs matmuls save and checkpoint regions' boundary
  // inputs (the default: the activations the literature compresses), or
  // every floating save.
  bool all_saves = false;
  // Saves smaller than this stay as they are (not worth a kernel).
  std::size_t min_bytes = 4096;
};

class CompressHooks final : public TypedSavedTensorHooks {
 public:
  explicit CompressHooks(CompressOptions options = {});

  std::string name() const override;
  // Floating tensors (CPU or CUDA; packed and unpacked on their device, with
  // the same bits) of activation memory (never parameters, gradients or
  // optimizer state that ops save) of at least min_bytes, saved by a matmul
  // as an input or kept as a region's boundary unless all_saves; bf16 takes
  // f32 only.
  bool wants(const Tensor& t, const SaveInfo& info) const override;
  std::any pack_tensor(const Tensor& t, const SaveInfo& info) override;
  Tensor unpack_tensor(std::any packed, const SaveInfo& info) override;

  // What this hook packed since it was made (or reset_stats); a save that
  // shared an earlier save's packed tensor counts once.
  struct Stats {
    std::int64_t saves = 0;
    std::int64_t original_bytes = 0;
    std::int64_t compressed_bytes = 0;
  };
  Stats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_stats() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = {};
  }
  const CompressOptions& options() const { return options_; }

 private:
  // A view already packed while its storage lives: a second save of it (the
  // q, k and v projections all save the same normed input) shares the packed
  // tensor instead of compressing it again.
  struct Packed {
    std::weak_ptr<Storage> source;
    std::int64_t offset = 0;
    Shape sizes, strides;
    std::uint64_t version = 0;
    std::weak_ptr<TensorImpl> packed;
  };

  CompressOptions options_;
  Stats stats_;
  std::vector<Packed> recent_;
  mutable std::mutex mu_;
};

}  // namespace remat
