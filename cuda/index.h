// Indexing kernels for ops/index.h on CUDA: gathers of any dtype by i32/i64
// index tensors, and deterministic scatter-adds (no float atomics: every
// output element sums its sources in increasing source order, in f32, and is
// rounded once, as the CPU kernels do). Index values are assumed in range: the
// ops check them on the host first. Every function queues work on `stream`
// and returns without waiting; pointers are device pointers.
#pragma once

#include <cstdint>

#include "cuda/strided.h"
#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// out[o, j, :] = x[o, index[j * index_stride], :] for o < outer, j < k: x is a
// contiguous [outer, n, inner] and out a contiguous [outer, k, inner] buffer of
// `dtype` elements (copied bit for bit; 128-bit words where the rows allow).
void index_select_rows(void* out, const void* x, DType dtype, const void* index, DType index_dtype,
                       std::int64_t index_stride, std::int64_t outer, std::int64_t n, std::int64_t k,
                       std::int64_t inner, StreamId stream);

// out[p] = x[p with coordinate `dim` replaced by index[p]] for every position p
// of out_l (any dtype, copied bit for bit). index_l has out_l's sizes (stride 0
// broadcasts, e.g. a 1-D index over the other dims); only x_l's strides are read.
void gather(void* out, const Strided& out_l, const void* x, const Strided& x_l, const void* index,
            DType index_dtype, const Strided& index_l, DType dtype, int dim, StreamId stream);

// Scatter-add by scanning, for a small k: region_l has index's sizes except
// size n (out's) at `dim`, and out's strides. For every position q of it,
// out[q] = round(f32(out[q]) + sum of src[q with dim = j] over j < k, in
// increasing j, where index[q with dim = j] == q[dim]); out elements nothing
// lands on are left as they are. src_l and index_l give strides for the same
// dims (their stride at `dim` steps j; stride 0 broadcasts). Cost O(region * k).
void scatter_add_scan(void* out, DType out_dtype, const Strided& region_l, const void* src,
                      DType src_dtype, const Strided& src_l, const void* index, DType index_dtype,
                      const Strided& index_l, int dim, std::int64_t k, StreamId stream);

// Scatter-add from host-built lists (i64 device arrays): for t < touched,
// out[dest[t]] = round(f32(out[dest[t]]) + sum of src[offset_of(src_l, order[i])]
// over i in [seg[t], seg[t + 1]), in increasing i). dest are element offsets
// into out, distinct; order are linear positions over src_l's sizes.
void scatter_add_lists(void* out, DType out_dtype, const void* src, DType src_dtype,
                       const Strided& src_l, const std::int64_t* dest, const std::int64_t* seg,
                       const std::int64_t* order, std::int64_t touched, StreamId stream);

// index_add from host-built lists (i64 device arrays): out is a contiguous
// [outer, n, inner] buffer; src_l is src's layout (its dims before `dim`
// flatten to outer, those after to inner; its size at `dim` is the number of
// indices). For t < touched, o < outer, i < inner:
// out[o, slice[t], i] = round(f32(out[o, slice[t], i]) + sum of src[o, order[l], i]
// over l in [seg[t], seg[t + 1]), in increasing l). slice values are distinct.
void index_add_lists(void* out, DType out_dtype, std::int64_t outer, std::int64_t n,
                     std::int64_t inner, const void* src, DType src_dtype, const Strided& src_l,
                     int dim, const std::int64_t* slice, const std::int64_t* seg,
                     const std::int64_t* order, std::int64_t touched, StreamId stream);

}  // namespace remat::cuda
