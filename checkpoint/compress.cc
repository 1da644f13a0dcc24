#include "checkpoint/compress.h"

#include <cstring>

#include "engine/allocator.h"
#include "engine/error.h"
#include "ops/cast.h"
#include "ops/mxfp8.h"

namespace remat {

CompressFormat compress_format_from_name(const std::string& name) {
  if (name == "bf16") return CompressFormat::bf16;
  if (name == "fp8") return CompressFormat::fp8;
  throw Error("compress: unknown format '" + name + "'; valid formats are bf16 and fp8 (MXFP8 e4m3, one scale "
              "per 32 values)");
}

const char* compress_format_name(CompressFormat f) { return f == CompressFormat::bf16 ? "bf16" : "fp8"; }

CompressHooks::CompressHooks(CompressOptions options) : options_(options) {}

std::string CompressHooks::name() const { return std::string("compress:") + compress_format_name(options_.format); }

bool CompressHooks::wants(const Tensor& t, const SaveInfo& info) const {
  if (!t.defined() || t.nbytes() < options_.min_bytes) return false;  // CPU or CUDA: same bits
  if (options_.format == CompressFormat::bf16 ? t.dtype() != DType::f32 : !is_floating(t.dtype())) return false;
  const bool matmul_input = std::strcmp(info.op, "matmul") == 0 && !info.is_output;
  const bool boundary = std::strcmp(info.op, "checkpoint_boundary") == 0;  // a region's kept input
  if (!options_.all_saves && !matmul_input && !boundary) return false;
  const MemoryCategory c = t.impl().storage->category();
  return c != MemoryCategory::parameter && c != MemoryCategory::gradient && c != MemoryCategory::optimizer;
}

std::any CompressHooks::pack_tensor(const Tensor& t, const SaveInfo&) {
  const auto& storage = t.impl().storage;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Forget views whose storage or packed tensor is gone (a freed storage's
    // address may come back for another tensor: the weak pointer tells).
    std::erase_if(recent_, [](const Packed& p) { return p.source.expired() || p.packed.expired(); });
    for (const auto& p : recent_)
      if (p.source.lock() == storage && p.offset == t.storage_offset() && p.sizes == t.sizes() &&
          p.strides == t.strides() && p.version == t.version())
        if (auto impl = p.packed.lock()) return Tensor(impl);
  }
  Tensor packed = options_.format == CompressFormat::bf16 ? cast(t, DType::bf16) : mxfp8_quantize(t);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.saves;
  stats_.original_bytes += std::int64_t(t.nbytes());
  stats_.compressed_bytes += std::int64_t(packed.nbytes());
  recent_.push_back(Packed{storage, t.storage_offset(), t.sizes(), t.strides(), t.version(), packed.impl_ptr()});
  return packed;
}

Tensor CompressHooks::unpack_tensor(std::any packed, const SaveInfo& info) {
  const Tensor& p = std::any_cast<const Tensor&>(packed);
  if (options_.format == CompressFormat::bf16) return cast(p, info.meta.dtype);
  return mxfp8_dequantize(p, info.meta.sizes, info.meta.dtype);
}

}  // namespace remat
