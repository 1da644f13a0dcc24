// Multi-tensor optimizer kernels: one block per chunk of kMultiTensorChunk
// elements of one tensor; the block finds its tensor by a binary search over
// the slots' first chunks. Arithmetic uses the explicitly rounded intrinsics
// (__fmul_rn, __fadd_rn, ...), which the compiler never fuses into FMAs, so
// the AdamW update is the CPU's bit for bit.
#include "cuda/adamw.h"
#include "cuda/kernel_util.cuh"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

constexpr int kThreads = 256;
// Chunks per launch (a grid's x dimension stays well inside its 2^31 - 1 limit).
constexpr std::int64_t kMaxGrid = std::int64_t(1) << 30;

// The slot that owns `chunk`: the last slot whose first_chunk <= chunk (empty
// slots own no chunks, so a later slot with the same first_chunk wins).
template <typename Slot>
__device__ std::int64_t find_slot(const Slot* slots, std::int64_t count, std::int64_t chunk) {
  std::int64_t lo = 0, hi = count - 1;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (slots[mid].first_chunk <= chunk) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The block's slot (looked up once, shared) and its element range [begin, end).
template <typename Slot>
__device__ Slot block_slot(const Slot* slots, std::int64_t count, std::int64_t chunk, std::int64_t& begin,
                           std::int64_t& end) {
  __shared__ std::int64_t index;
  if (threadIdx.x == 0) index = find_slot(slots, count, chunk);
  __syncthreads();
  const Slot s = slots[index];
  begin = (chunk - s.first_chunk) * kMultiTensorChunk;
  end = min(s.numel, begin + kMultiTensorChunk);
  return s;
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

// The CPU AdamW's update of one element, operation for operation.
__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v, float decay,
                                              const AdamWScalars& s) {
  m = __fadd_rn(__fmul_rn(s.beta1, m), __fmul_rn(s.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(s.beta2, v), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), s.inv_sqrt_bc2), s.eps);
  p = __fsub_rn(__fmul_rn(p, decay), __fdiv_rn(__fmul_rn(s.step_size, m), denom));
}

__global__ void __launch_bounds__(kThreads)
adamw_kernel(const AdamWSlot* slots, std::int64_t count, std::int64_t chunk_base, AdamWScalars sc) {
  std::int64_t begin, end;
  const AdamWSlot s = block_slot(slots, count, chunk_base + blockIdx.x, begin, end);
  const bool vec = aligned16(s.param) && aligned16(s.grad) && aligned16(s.exp_avg) && aligned16(s.exp_avg_sq);
  std::int64_t i = begin + threadIdx.x;
  if (vec) {
    // Full groups of 4 as 128-bit loads and stores; begin is a multiple of 4.
    const std::int64_t groups = (end - begin) / 4;
    for (std::int64_t q = threadIdx.x; q < groups; q += blockDim.x) {
      const std::int64_t e = begin + 4 * q;
      float4 p = *reinterpret_cast<const float4*>(s.param + e);
      const float4 g = *reinterpret_cast<const float4*>(s.grad + e);
      float4 m = *reinterpret_cast<const float4*>(s.exp_avg + e);
      float4 v = *reinterpret_cast<const float4*>(s.exp_avg_sq + e);
      adamw_element(p.x, g.x, m.x, v.x, s.decay, sc);
      adamw_element(p.y, g.y, m.y, v.y, s.decay, sc);
      adamw_element(p.z, g.z, m.z, v.z, s.decay, sc);
      adamw_element(p.w, g.w, m.w, v.w, s.decay, sc);
      *reinterpret_cast<float4*>(s.param + e) = p;
      *reinterpret_cast<float4*>(s.exp_avg + e) = m;
      *reinterpret_cast<float4*>(s.exp_avg_sq + e) = v;
    }
    i = begin + 4 * groups + threadIdx.x;
  }
  for (; i < end; i += blockDim.x) {
    float p = s.param[i], m = s.exp_avg[i], v = s.exp_avg_sq[i];
    adamw_element(p, s.grad[i], m, v, s.decay, sc);
    s.param[i] = p;
    s.exp_avg[i] = m;
    s.exp_avg_sq[i] = v;
  }
}

// Sum over the block in double (blockDim.x a multiple of 32), returned to
// every thread; the order of additions is fixed for a given blockDim.
__device__ __forceinline__ double block_sum_f64(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? scratch[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ double square(float x) { return double(x) * double(x); }

// partials[chunk] = the chunk's sum of squares. Thread t adds groups of four
// elements q = t, t + blockDim, ... (each group in element order), whether
// it loads them as one 128-bit load or one by one, so the sum does not
// depend on the buffer's alignment.
__global__ void __launch_bounds__(kThreads)
sum_squares_kernel(const TensorSlot* slots, std::int64_t count, std::int64_t chunk_base, double* partials) {
  __shared__ double scratch[32];
  std::int64_t begin, end;
  const std::int64_t chunk = chunk_base + blockIdx.x;
  const TensorSlot s = block_slot(slots, count, chunk, begin, end);
  const bool vec = aligned16(s.data);
  const std::int64_t n = end - begin, groups = (n + 3) / 4;
  const float* base = s.data + begin;
  double acc = 0.0;
  for (std::int64_t q = threadIdx.x; q < groups; q += blockDim.x) {
    const std::int64_t e = 4 * q;
    if (vec && e + 4 <= n) {
      const float4 x = *reinterpret_cast<const float4*>(base + e);
      acc += square(x.x);
      acc += square(x.y);
      acc += square(x.z);
      acc += square(x.w);
    } else {
      for (std::int64_t j = e; j < e + 4 && j < n; ++j) acc += square(base[j]);
    }
  }
  acc = block_sum_f64(acc, scratch);
  if (threadIdx.x == 0) partials[chunk] = acc;
}

// *out = the sum of partials[0..n): thread t adds t, t + blockDim, ... in
// order, then the block's fixed-order reduction. One block.
__global__ void __launch_bounds__(kThreads) sum_partials_kernel(const double* partials, std::int64_t n, double* out) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
  acc = block_sum_f64(acc, scratch);
  if (threadIdx.x == 0) *out = acc;
}

__global__ void __launch_bounds__(kThreads)
scale_kernel(const TensorSlot* slots, std::int64_t count, std::int64_t chunk_base, float scale) {
  std::int64_t begin, end;
  const TensorSlot s = block_slot(slots, count, chunk_base + blockIdx.x, begin, end);
  std::int64_t i = begin + threadIdx.x;
  if (aligned16(s.data)) {
    const std::int64_t groups = (end - begin) / 4;
    for (std::int64_t q = threadIdx.x; q < groups; q += blockDim.x) {
      float4* p = reinterpret_cast<float4*>(s.data + begin + 4 * q);
      float4 x = *p;
      x.x = __fmul_rn(x.x, scale);
      x.y = __fmul_rn(x.y, scale);
      x.z = __fmul_rn(x.z, scale);
      x.w = __fmul_rn(x.w, scale);
      *p = x;
    }
    i = begin + 4 * groups + threadIdx.x;
  }
  for (; i < end; i += blockDim.x) s.data[i] = __fmul_rn(s.data[i], scale);
}

// Calls launch(chunk_base, blocks) over [0, total) in grids of at most kMaxGrid.
template <typename Fn>
void for_each_grid(std::int64_t total, Fn&& launch) {
  for (std::int64_t base = 0; base < total; base += kMaxGrid)
    launch(base, unsigned(total - base < kMaxGrid ? total - base : kMaxGrid));
}

void check_slots(const void* slots, std::int64_t count, std::int64_t total_chunks, const char* what) {
  if (count < 0 || total_chunks < 0 || (total_chunks > 0 && (slots == nullptr || count == 0)))
    throw DeviceError(std::string(what) + ": invalid multi-tensor launch (" + std::to_string(count) +
                      " slots, " + std::to_string(total_chunks) + " chunks)");
}

}  // namespace

void adamw_step(const AdamWSlot* slots, std::int64_t count, std::int64_t total_chunks, const AdamWScalars& s,
                StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  check_slots(slots, count, total_chunks, "adamw_step");
  for_each_grid(total_chunks, [&](std::int64_t base, unsigned blocks) {
    adamw_kernel<<<blocks, kThreads, 0, detail::as_stream(stream)>>>(slots, count, base, s);
    detail::check_launch("adamw_step");
  });
}

double sum_squares(const TensorSlot* slots, std::int64_t count, std::int64_t total_chunks, double* scratch,
                   StreamId stream) {
  if (meta_addresses_active()) return 0.0;  // a meta run launches nothing: a norm of 0 (docs/META.md)
  check_slots(slots, count, total_chunks, "sum_squares");
  if (total_chunks == 0) return 0.0;
  for_each_grid(total_chunks, [&](std::int64_t base, unsigned blocks) {
    sum_squares_kernel<<<blocks, kThreads, 0, detail::as_stream(stream)>>>(slots, count, base, scratch);
    detail::check_launch("sum_squares");
  });
  sum_partials_kernel<<<1, kThreads, 0, detail::as_stream(stream)>>>(scratch, total_chunks, scratch + total_chunks);
  detail::check_launch("sum_squares (final sum)");
  double result = 0.0;
  detail::check_cuda(cudaMemcpyAsync(&result, scratch + total_chunks, sizeof result, cudaMemcpyDeviceToHost,
                                     detail::as_stream(stream)),
                     "sum_squares result copy");
  detail::check_cuda(cudaStreamSynchronize(detail::as_stream(stream)), "sum_squares synchronize");
  return result;
}

void scale_tensors(const TensorSlot* slots, std::int64_t count, std::int64_t total_chunks, float scale,
                   StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  check_slots(slots, count, total_chunks, "scale_tensors");
  for_each_grid(total_chunks, [&](std::int64_t base, unsigned blocks) {
    scale_kernel<<<blocks, kThreads, 0, detail::as_stream(stream)>>>(slots, count, base, scale);
    detail::check_launch("scale_tensors");
  });
}

}  // namespace remat::cuda
