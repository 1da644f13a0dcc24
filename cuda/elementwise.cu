// Elementwise kernels: each op is a small functor over f32 values run by the
// generic map of elementwise.cuh (dense packs, packs along broadcast rows, or
// strided). The functors spell out the CPU kernels' formulas operation by
// operation with round-to-nearest intrinsics, so nvcc cannot fuse a multiply
// and an add the CPU rounds separately: the arithmetic ops give the CPU's bits,
// the transcendental ones (expf, logf, tanhf, powf) differ by an ulp or two.
#include "cuda/elementwise.h"

#include <string>
#include <type_traits>

#include "cuda/elementwise.cuh"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

using detail::launch_map;

// ---- binary ----

template <BinaryOp K>
__device__ __forceinline__ float apply(float a, float b) {
  if constexpr (K == BinaryOp::add) return __fadd_rn(a, b);
  else if constexpr (K == BinaryOp::sub) return __fsub_rn(a, b);
  else if constexpr (K == BinaryOp::mul) return __fmul_rn(a, b);
  else return __fdiv_rn(a, b);
}

template <BinaryOp K>
struct BinaryF {
  __device__ float operator()(float a, float b) const { return apply<K>(a, b); }
};

template <BinaryOp K>
struct ScalarF {
  float s;
  bool scalar_first;
  __device__ float operator()(float a) const { return scalar_first ? apply<K>(s, a) : apply<K>(a, s); }
};

// Calls fn(std::integral_constant<BinaryOp, op>).
template <typename Fn>
void dispatch_binary(BinaryOp op, Fn&& fn) {
  switch (op) {
    case BinaryOp::add: fn(std::integral_constant<BinaryOp, BinaryOp::add>{}); return;
    case BinaryOp::sub: fn(std::integral_constant<BinaryOp, BinaryOp::sub>{}); return;
    case BinaryOp::mul: fn(std::integral_constant<BinaryOp, BinaryOp::mul>{}); return;
    case BinaryOp::div: fn(std::integral_constant<BinaryOp, BinaryOp::div>{}); return;
  }
  throw Error("cuda::binary: unknown op " + std::to_string(int(op)));
}

// ---- unary (forward), as ops/unary.cc ----

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

// k * (x + c x^3), the argument of gelu's tanh.
__device__ __forceinline__ float gelu_inner(float x) {
  return __fmul_rn(kGeluK, __fadd_rn(x, __fmul_rn(__fmul_rn(__fmul_rn(kGeluC, x), x), x)));
}
__device__ __forceinline__ float sigmoid_of(float x) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}

struct NegF {
  __device__ float operator()(float x) const { return -x; }
};
struct ExpF {
  __device__ float operator()(float x) const { return expf(x); }
};
struct LogF {
  __device__ float operator()(float x) const { return logf(x); }
};
struct SqrtF {
  __device__ float operator()(float x) const { return __fsqrt_rn(x); }
};
struct RsqrtF {
  __device__ float operator()(float x) const { return __fdiv_rn(1.0f, __fsqrt_rn(x)); }
};
struct PowF {
  float p;
  __device__ float operator()(float x) const { return powf(x, p); }
};
struct AbsF {
  __device__ float operator()(float x) const { return fabsf(x); }
};
// max(x, 0) keeping NaN and -0 as the CPU's max does.
struct ReluF {
  __device__ float operator()(float x) const { return x < 0.0f ? 0.0f : x; }
};
struct GeluF {
  __device__ float operator()(float x) const {
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(gelu_inner(x))));
  }
};
struct SiluF {
  __device__ float operator()(float x) const { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }
};
struct SigmoidF {
  __device__ float operator()(float x) const { return sigmoid_of(x); }
};
struct TanhF {
  __device__ float operator()(float x) const { return tanhf(x); }
};

// ---- unary (backward): f(dy, saved) ----

struct ExpB {  // saved y
  __device__ float operator()(float g, float y) const { return __fmul_rn(g, y); }
};
struct LogB {  // saved x
  __device__ float operator()(float g, float x) const { return __fdiv_rn(g, x); }
};
struct SqrtB {  // saved y: g * 0.5 / y
  __device__ float operator()(float g, float y) const { return __fdiv_rn(__fmul_rn(g, 0.5f), y); }
};
struct RsqrtB {  // saved y: g * (-1/2) * y^3
  __device__ float operator()(float g, float y) const {
    return __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(g, -0.5f), y), y), y);
  }
};
struct PowB {  // saved x: g * p * x^(p-1)
  float p;
  __device__ float operator()(float g, float x) const {
    return __fmul_rn(__fmul_rn(g, p), powf(x, __fsub_rn(p, 1.0f)));
  }
};
struct AbsB {  // saved x: g * sign(x), sign(0) = 0
  __device__ float operator()(float g, float x) const {
    const float sign = x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
    return __fmul_rn(g, sign);
  }
};
struct ReluB {  // saved y
  __device__ float operator()(float g, float y) const { return y > 0.0f ? g : 0.0f; }
};
struct GeluB {  // saved x
  __device__ float operator()(float g, float x) const {
    constexpr float k3C = 3.0f * kGeluC;
    const float t = tanhf(gelu_inner(x));
    const float dinner = __fmul_rn(kGeluK, __fadd_rn(1.0f, __fmul_rn(__fmul_rn(k3C, x), x)));
    const float a = __fmul_rn(0.5f, __fadd_rn(1.0f, t));
    const float b = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), __fsub_rn(1.0f, __fmul_rn(t, t))), dinner);
    return __fmul_rn(g, __fadd_rn(a, b));
  }
};
struct SiluB {  // saved x: g * s * (1 + x (1 - s)), s = sigmoid(x)
  __device__ float operator()(float g, float x) const {
    const float s = sigmoid_of(x);
    return __fmul_rn(__fmul_rn(g, s), __fadd_rn(1.0f, __fmul_rn(x, __fsub_rn(1.0f, s))));
  }
};
struct SigmoidB {  // saved y: g * y * (1 - y)
  __device__ float operator()(float g, float y) const {
    return __fmul_rn(__fmul_rn(g, y), __fsub_rn(1.0f, y));
  }
};
struct TanhB {  // saved y: g * (1 - y^2)
  __device__ float operator()(float g, float y) const {
    return __fmul_rn(g, __fsub_rn(1.0f, __fmul_rn(y, y)));
  }
};

// ---- in-place updates: f(x, y) ----

struct AddUpdate {
  float alpha;
  __device__ float operator()(float x, float y) const { return __fadd_rn(x, __fmul_rn(alpha, y)); }
};
struct MulUpdate {
  __device__ float operator()(float x, float y) const { return __fmul_rn(x, y); }
};
struct ScaleUpdate {
  float alpha;
  __device__ float operator()(float x) const { return __fmul_rn(x, alpha); }
};

// One input: out[dense] = f(x[x_l]).
template <typename F>
void map1(const char* what, void* out, const void* x, const Strided& x_l, DType dtype, F f,
          StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  detail::dispatch_floating(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    const T* in[1] = {static_cast<const T*>(x)};
    const Strided ls[1] = {x_l};
    launch_map<T, 1>(what, static_cast<T*>(out), contiguous_layout(x_l.sizes, x_l.dim), in, ls, f,
                     stream);
  });
}

// Two inputs: out[out_l] = f(a[a_l], b[b_l]).
template <typename F>
void map2(const char* what, void* out, const Strided& out_l, const void* a, const Strided& a_l,
          const void* b, const Strided& b_l, DType dtype, F f, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  detail::dispatch_floating(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    const T* in[2] = {static_cast<const T*>(a), static_cast<const T*>(b)};
    const Strided ls[2] = {a_l, b_l};
    launch_map<T, 2>(what, static_cast<T*>(out), out_l, in, ls, f, stream);
  });
}

void check_same_sizes(const char* what, const Strided& a, const Strided& b) {
  bool same = a.dim == b.dim;
  for (int d = 0; same && d < a.dim; ++d) same = a.sizes[d] == b.sizes[d];
  if (!same) throw ShapeError(std::string(what) + ": operand layouts have different sizes");
}

}  // namespace

void binary(BinaryOp op, void* out, const void* a, const Strided& a_l, const void* b,
            const Strided& b_l, DType dtype, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  check_same_sizes("cuda::binary", a_l, b_l);
  const Strided out_l = contiguous_layout(a_l.sizes, a_l.dim);
  dispatch_binary(op, [&](auto k) {
    map2("cuda::binary", out, out_l, a, a_l, b, b_l, dtype, BinaryF<decltype(k)::value>{}, stream);
  });
}

void binary_scalar(BinaryOp op, void* out, const void* a, const Strided& a_l, float s,
                   bool scalar_first, DType dtype, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  dispatch_binary(op, [&](auto k) {
    map1("cuda::binary_scalar", out, a, a_l, dtype, ScalarF<decltype(k)::value>{s, scalar_first},
         stream);
  });
}

void unary(UnaryOp op, void* out, const void* x, const Strided& x_l, DType dtype, float param,
           StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const char* what = "cuda::unary";
  switch (op) {
    case UnaryOp::neg: return map1(what, out, x, x_l, dtype, NegF{}, stream);
    case UnaryOp::exp: return map1(what, out, x, x_l, dtype, ExpF{}, stream);
    case UnaryOp::log: return map1(what, out, x, x_l, dtype, LogF{}, stream);
    case UnaryOp::sqrt: return map1(what, out, x, x_l, dtype, SqrtF{}, stream);
    case UnaryOp::rsqrt: return map1(what, out, x, x_l, dtype, RsqrtF{}, stream);
    case UnaryOp::pow: return map1(what, out, x, x_l, dtype, PowF{param}, stream);
    case UnaryOp::abs: return map1(what, out, x, x_l, dtype, AbsF{}, stream);
    case UnaryOp::relu: return map1(what, out, x, x_l, dtype, ReluF{}, stream);
    case UnaryOp::gelu: return map1(what, out, x, x_l, dtype, GeluF{}, stream);
    case UnaryOp::silu: return map1(what, out, x, x_l, dtype, SiluF{}, stream);
    case UnaryOp::sigmoid: return map1(what, out, x, x_l, dtype, SigmoidF{}, stream);
    case UnaryOp::tanh: return map1(what, out, x, x_l, dtype, TanhF{}, stream);
  }
  throw Error("cuda::unary: unknown op " + std::to_string(int(op)));
}

void unary_backward(UnaryOp op, void* out, const void* dy, const Strided& dy_l, const void* saved,
                    const Strided& saved_l, DType dtype, float param, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const char* what = "cuda::unary_backward";
  if (op == UnaryOp::neg) return map1(what, out, dy, dy_l, dtype, NegF{}, stream);
  check_same_sizes(what, dy_l, saved_l);
  const Strided out_l = contiguous_layout(dy_l.sizes, dy_l.dim);
  auto run = [&](auto f) { map2(what, out, out_l, dy, dy_l, saved, saved_l, dtype, f, stream); };
  switch (op) {
    case UnaryOp::neg: return;  // handled above
    case UnaryOp::exp: return run(ExpB{});
    case UnaryOp::log: return run(LogB{});
    case UnaryOp::sqrt: return run(SqrtB{});
    case UnaryOp::rsqrt: return run(RsqrtB{});
    case UnaryOp::pow: return run(PowB{param});
    case UnaryOp::abs: return run(AbsB{});
    case UnaryOp::relu: return run(ReluB{});
    case UnaryOp::gelu: return run(GeluB{});
    case UnaryOp::silu: return run(SiluB{});
    case UnaryOp::sigmoid: return run(SigmoidB{});
    case UnaryOp::tanh: return run(TanhB{});
  }
  throw Error("cuda::unary_backward: unknown op " + std::to_string(int(op)));
}

void update(UpdateOp op, void* x, const Strided& x_l, const void* y, const Strided& y_l,
            float alpha, DType dtype, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const char* what = "cuda::update";
  switch (op) {
    case UpdateOp::scale:
      detail::dispatch_floating(dtype, what, [&](auto tag) {
        using T = decltype(tag);
        const T* in[1] = {static_cast<const T*>(x)};
        const Strided ls[1] = {x_l};
        launch_map<T, 1>(what, static_cast<T*>(x), x_l, in, ls, ScaleUpdate{alpha}, stream);
      });
      return;
    case UpdateOp::add:
      check_same_sizes(what, x_l, y_l);
      return map2(what, x, x_l, x, x_l, y, y_l, dtype, AddUpdate{alpha}, stream);
    case UpdateOp::mul:
      check_same_sizes(what, x_l, y_l);
      return map2(what, x, x_l, x, x_l, y, y_l, dtype, MulUpdate{}, stream);
  }
  throw Error("cuda::update: unknown op " + std::to_string(int(op)));
}

}  // namespace remat::cuda
