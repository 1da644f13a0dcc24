// MoE row movement: one block per row (gather) or per token (combine) over
// grid-stride loops, threads across the row's columns (coalesced). Products
// and sums use the explicitly rounded intrinsics, so nothing is fused into an
// FMA and the results equal the CPU kernels of moe/dispatch.cc bit for bit.
#include "cuda/kernel_util.cuh"
#include "cuda/moe_dispatch.h"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

using detail::from_f32;
using detail::load_f32;

// Threads per block for rows of d elements: a warp multiple, at most 256.
int row_threads(std::int64_t d) {
  const std::int64_t t = (d + 31) / 32 * 32;
  return int(t < 32 ? 32 : t > 256 ? 256 : t);
}

template <typename To, typename From>
__global__ void gather_rows_kernel(To* out, const From* x, const std::int64_t* src, const float* w,
                                   std::int64_t rows, std::int64_t d) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const From* xr = x + src[r] * d;
    To* o = out + r * d;
    if (w) {
      const float wr = w[r];
      for (std::int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = from_f32<To>(__fmul_rn(wr, load_f32(xr + c)));
    } else {
      for (std::int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = from_f32<To>(load_f32(xr + c));
    }
  }
}

// Same dtype, no weights, rows a multiple of 16 bytes: a 128-bit word copy.
__global__ void gather_words_kernel(uint4* out, const uint4* x, const std::int64_t* src, std::int64_t rows,
                                    std::int64_t words) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint4* xr = x + src[r] * words;
    uint4* o = out + r * words;
    for (std::int64_t c = threadIdx.x; c < words; c += blockDim.x) o[c] = xr[c];
  }
}

__global__ void fill_i64_kernel(std::int64_t* p, std::int64_t n, std::int64_t value) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    p[i] = value;
}

__global__ void invert_kernel(std::int64_t* row_of_slot, const std::int64_t* slot_of_row, std::int64_t rows) {
  for (std::int64_t r = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += std::int64_t(gridDim.x) * blockDim.x)
    row_of_slot[slot_of_row[r]] = r;
}

// One block per token: its rows (sorted ascending into shared memory by
// thread 0), then each thread sums its columns over them in that order.
template <typename To, typename From>
__global__ void combine_rows_kernel(To* out, const From* y, const float* w, const std::int64_t* row_of_slot,
                                    std::int64_t tokens, std::int64_t top_k, std::int64_t d) {
  extern __shared__ std::int64_t token_rows[];  // top_k entries
  __shared__ std::int64_t first;                 // index of the first non-negative entry
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    __syncthreads();  // the previous token's rows are no longer read
    for (std::int64_t k = threadIdx.x; k < top_k; k += blockDim.x) token_rows[k] = row_of_slot[t * top_k + k];
    __syncthreads();
    if (threadIdx.x == 0) {
      for (std::int64_t i = 1; i < top_k; ++i) {  // insertion sort: top_k is small
        const std::int64_t v = token_rows[i];
        std::int64_t j = i - 1;
        for (; j >= 0 && token_rows[j] > v; --j) token_rows[j + 1] = token_rows[j];
        token_rows[j + 1] = v;
      }
      std::int64_t f = 0;
      while (f < top_k && token_rows[f] < 0) ++f;  // dropped slots sort first
      first = f;
    }
    __syncthreads();
    To* o = out + t * d;
    for (std::int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      float acc = 0.0f;
      for (std::int64_t k = first; k < top_k; ++k) {
        const std::int64_t r = token_rows[k];
        const float v = load_f32(y + r * d + c);
        acc = __fadd_rn(acc, w ? __fmul_rn(w[r], v) : v);
      }
      o[c] = from_f32<To>(acc);
    }
  }
}

// Eight threads per row (a warp holds four rows): lane j sums elements j, j + 8,
// ... then the lanes combine as ops_detail::lane_dot does.
template <typename A, typename B>
__global__ void row_dots_kernel(float* out, const A* a, const std::int64_t* a_rows, const B* b, std::int64_t rows,
                                std::int64_t d) {
  const int lane = threadIdx.x & 7;
  const std::int64_t per_block = blockDim.x / 8;
  for (std::int64_t base = std::int64_t(blockIdx.x) * per_block; base < rows;
       base += std::int64_t(gridDim.x) * per_block) {
    const std::int64_t r = base + (threadIdx.x >> 3);
    float acc = 0.0f;
    if (r < rows) {
      const A* ar = a + a_rows[r] * d;
      const B* br = b + r * d;
      for (std::int64_t i = lane; i < d; i += 8) acc = __fadd_rn(acc, __fmul_rn(load_f32(ar + i), load_f32(br + i)));
    }
    // (l0 + l4), (l1 + l5), (l2 + l6), (l3 + l7); then pairs; then the halves.
    acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 4));
    acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 1));
    acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 2));
    if (r < rows && lane == 0) out[r] = acc;
  }
}

unsigned grid_for(std::int64_t items) { return detail::blocks_for(items, 1); }

}  // namespace

void moe_gather_rows(void* out, DType out_dtype, const void* x, DType x_dtype, const std::int64_t* src,
                     const float* w, std::int64_t rows, std::int64_t d, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (rows <= 0 || d <= 0) return;
  const cudaStream_t s = detail::as_stream(stream);
  const std::int64_t row_bytes = d * std::int64_t(element_size(x_dtype));
  const auto aligned = [](const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; };
  if (!w && out_dtype == x_dtype && row_bytes % 16 == 0 && aligned(out) && aligned(x)) {
    const std::int64_t words = row_bytes / 16;
    gather_words_kernel<<<grid_for(rows), row_threads(words), 0, s>>>(
        static_cast<uint4*>(out), static_cast<const uint4*>(x), src, rows, words);
    detail::check_launch("moe_gather_rows");
    return;
  }
  detail::dispatch_floating(out_dtype, "moe_gather_rows", [&](auto to) {
    using To = decltype(to);
    detail::dispatch_floating(x_dtype, "moe_gather_rows", [&](auto from) {
      using From = decltype(from);
      gather_rows_kernel<To, From><<<grid_for(rows), row_threads(d), 0, s>>>(
          static_cast<To*>(out), static_cast<const From*>(x), src, w, rows, d);
    });
  });
  detail::check_launch("moe_gather_rows");
}

void moe_invert_rows(std::int64_t* row_of_slot, std::int64_t slots, const std::int64_t* slot_of_row,
                     std::int64_t rows, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (slots <= 0) return;
  if (rows > slots)
    throw DeviceError("moe_invert_rows: " + std::to_string(rows) + " rows for " + std::to_string(slots) + " slots");
  const cudaStream_t s = detail::as_stream(stream);
  fill_i64_kernel<<<detail::blocks_for(slots, 256), 256, 0, s>>>(row_of_slot, slots, -1);
  detail::check_launch("moe_invert_rows (fill)");
  if (rows <= 0) return;
  invert_kernel<<<detail::blocks_for(rows, 256), 256, 0, s>>>(row_of_slot, slot_of_row, rows);
  detail::check_launch("moe_invert_rows");
}

void moe_combine_rows(void* out, DType out_dtype, const void* y, DType y_dtype, const float* w,
                      const std::int64_t* row_of_slot, std::int64_t tokens, std::int64_t top_k, std::int64_t d,
                      StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (tokens <= 0 || d <= 0) return;
  // top_k 0 is valid: every token gets 0, as on the CPU.
  if (top_k < 0 || top_k > 4096)
    throw DeviceError("moe_combine_rows: top_k " + std::to_string(top_k) + " is out of range [0, 4096]");
  const cudaStream_t s = detail::as_stream(stream);
  const std::size_t shared = std::size_t(top_k) * sizeof(std::int64_t);
  detail::dispatch_floating(out_dtype, "moe_combine_rows", [&](auto to) {
    using To = decltype(to);
    detail::dispatch_floating(y_dtype, "moe_combine_rows", [&](auto from) {
      using From = decltype(from);
      combine_rows_kernel<To, From><<<grid_for(tokens), row_threads(d), shared, s>>>(
          static_cast<To*>(out), static_cast<const From*>(y), w, row_of_slot, tokens, top_k, d);
    });
  });
  detail::check_launch("moe_combine_rows");
}

void moe_row_dots(float* out, const void* a, DType a_dtype, const std::int64_t* a_rows, const void* b,
                  DType b_dtype, std::int64_t rows, std::int64_t d, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (rows <= 0) return;
  constexpr int threads = 256;  // 32 rows per block
  const cudaStream_t s = detail::as_stream(stream);
  detail::dispatch_floating(a_dtype, "moe_row_dots", [&](auto ta) {
    using A = decltype(ta);
    detail::dispatch_floating(b_dtype, "moe_row_dots", [&](auto tb) {
      using B = decltype(tb);
      row_dots_kernel<A, B><<<detail::blocks_for(rows, threads / 8), threads, 0, s>>>(
          out, static_cast<const A*>(a), a_rows, static_cast<const B*>(b), rows, d);
    });
  });
  detail::check_launch("moe_row_dots");
}

}  // namespace remat::cuda
