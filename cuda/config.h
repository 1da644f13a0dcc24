// Whether this build has the CUDA back end. The cuda_library rule
// (third_party/cuda/cuda.bzl) defines REMAT_HAVE_CUDA for every target that
// depends on //cuda: 1 when a toolkit was found, 0 otherwise (then //cuda is
// these headers only, with no definitions behind them).
//
// ops/ keeps each op's CUDA branch next to its CPU one, inside
// `if constexpr (kHaveCuda)`: a function named only inside a discarded
// statement needs no definition (C++17 [basic.def.odr]), so a build without
// the toolkit compiles the same sources and links without stubs.
#pragma once

#ifndef REMAT_HAVE_CUDA
#error "REMAT_HAVE_CUDA is not defined: depend on //cuda to include cuda/ headers"
#endif

namespace remat::cuda {

inline constexpr bool kHaveCuda = REMAT_HAVE_CUDA != 0;

}  // namespace remat::cuda
