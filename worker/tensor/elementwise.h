#ifndef DISTRAIN_WORKER_TENSOR_ELEMENTWISE_H_
#define DISTRAIN_WORKER_TENSOR_ELEMENTWISE_H_

// Element-wise math of the op seam (ops.h), written once as small functors
// that the CPU loops (worker/tensor/cpu/elementwise_cpu.cc) and the CUDA
// kernels (worker/tensor/cuda/, a later issue) both instantiate, so the two
// backends round the same formulas the same way (up to the libm each links).
//
// Every functor is a trivially copyable value with a const call operator and
// no state beyond its parameters; they are thread-safe. Only C math
// functions that CUDA also provides for device code (expf, erff, tanhf,
// logf, log1pf) appear here.

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define DISTRAIN_HOST_DEVICE __host__ __device__
#else
#define DISTRAIN_HOST_DEVICE
#endif

namespace distrain::elementwise {

// ---- Activations -------------------------------------------------------------
// Forward functors map x to y; gradient functors map (saved value, dy) to dx,
// where the saved value is the forward output y for ReLU, sigmoid and tanh
// (their derivatives are cheapest in y) and the input x for GELU.

struct Relu {
  DISTRAIN_HOST_DEVICE float operator()(float x) const { return x > 0.0f ? x : 0.0f; }
};
struct ReluGrad {  // from y: y > 0 exactly where x > 0
  DISTRAIN_HOST_DEVICE float operator()(float y, float dy) const { return y > 0.0f ? dy : 0.0f; }
};

struct Sigmoid {
  DISTRAIN_HOST_DEVICE float operator()(float x) const {
    // Both branches keep expf's argument <= 0, so nothing overflows and the
    // small tail keeps its relative precision (1 / (1 + e^-x) would round
    // sigmoid(-100) to 0 only after computing e^100 = inf).
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    const float e = expf(x);
    return e / (1.0f + e);
  }
};
struct SigmoidGrad {
  DISTRAIN_HOST_DEVICE float operator()(float y, float dy) const { return dy * y * (1.0f - y); }
};

struct Tanh {
  DISTRAIN_HOST_DEVICE float operator()(float x) const { return tanhf(x); }
};
struct TanhGrad {
  DISTRAIN_HOST_DEVICE float operator()(float y, float dy) const { return dy * (1.0f - y * y); }
};

// Keras' gelu(approximate=False): x * Phi(x) with the exact normal CDF.
constexpr float kSqrtHalf = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1 / sqrt(2 pi)
struct Gelu {
  DISTRAIN_HOST_DEVICE float operator()(float x) const {
    return 0.5f * x * (1.0f + erff(x * kSqrtHalf));
  }
};
struct GeluGrad {  // d/dx x Phi(x) = Phi(x) + x phi(x)
  DISTRAIN_HOST_DEVICE float operator()(float x, float dy) const {
    const float cdf = 0.5f * (1.0f + erff(x * kSqrtHalf));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    return dy * (cdf + x * pdf);
  }
};

// ---- Dropout -----------------------------------------------------------------

// A counter-based generator: the 64-bit SplitMix64 finaliser of (stream,
// index). Every element's draw is independent of how the tensor is split
// into threads or CUDA blocks, so a mask is a pure function of (stream, i).
DISTRAIN_HOST_DEVICE inline uint64_t CounterHash(uint64_t stream, uint64_t index) {
  uint64_t x = stream ^ (index * 0x9e3779b97f4a7c15ULL);
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Element i survives when the high 32 bits of its hash reach `threshold` =
// rate * 2^32 (DropThreshold): probability 1 - rate to within 2^-32. An
// integer comparison, so both backends agree bit for bit.
inline uint64_t DropThreshold(double rate) {
  return static_cast<uint64_t>(rate * 4294967296.0);
}
struct DropoutMask {
  uint64_t stream;
  uint64_t threshold;
  float scale;  // 1 / (1 - rate)
  DISTRAIN_HOST_DEVICE float operator()(uint64_t index) const {
    return (CounterHash(stream, index) >> 32) >= threshold ? scale : 0.0f;
  }
};

// ---- Mixed precision ---------------------------------------------------------
// A float32 rounded to the nearest value of a 16-bit type and kept as a
// float32 (every bfloat16 and float16 value is exactly a float32), so
// tensors keep one storage type while their values are the 16-bit type's.
// Round to nearest, ties to even, as every conversion instruction does
// (cvtneps2bf16, __float2bfloat16_rn, __float2half_rn); NaN stays NaN.

DISTRAIN_HOST_DEVICE inline uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  __builtin_memcpy(&bits, &x, sizeof bits);
  return bits;
#endif
}
DISTRAIN_HOST_DEVICE inline float BitsFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  __builtin_memcpy(&x, &bits, sizeof x);
  return x;
#endif
}

// bfloat16: float32's exponent, 7 mantissa bits. Values beyond its largest
// finite value by half an ulp or more round to infinity, as in hardware.
// Both functors are branch-free (selects only), so the CPU loops vectorise.
struct RoundToBfloat16 {
  DISTRAIN_HOST_DEVICE float operator()(float x) const {
    const uint32_t bits = FloatBits(x);
    // A carry out of the mantissa into the exponent is the right rounding,
    // and turns the largest values into infinity; infinity stays.
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    // A NaN stays a NaN (quiet), even one whose payload is in the low bits.
    const uint32_t nan = (bits | 0x00400000u) & 0xffff0000u;
    return BitsFloat((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
};

// float16 (IEEE binary16): 5 exponent bits, 10 mantissa bits, largest
// finite 65504, subnormals down to 2^-24. From 65520 (the tie between 65504
// and the next power of two, 65536, which float16 cannot hold) up: infinity
// — the overflow dynamic loss scaling exists to catch.
struct RoundToFloat16 {
  DISTRAIN_HOST_DEVICE float operator()(float x) const {
    const float a = fabsf(x);
    // A normal float16: keep 10 of float32's 23 mantissa bits.
    const uint32_t bits = FloatBits(a);
    const float normal = BitsFloat((bits + 0x0fffu + ((bits >> 13) & 1u)) & ~0x1fffu);
    // Below 2^-14, the subnormal grid (multiples of 2^-24): adding 0.5, whose
    // float32 ulp is 2^-24, rounds to it; subtracting it again is exact.
    const float subnormal = (a + 0.5f) - 0.5f;
    float r = a < 6.103515625e-05f ? subnormal : normal;
    r = a >= 65520.0f ? __builtin_huge_valf() : r;
    r = copysignf(r, x);
    return a == a ? r : x;  // NaN stays NaN
  }
};

// ---- Loss pieces (per element; labels as float targets) ------------------------
// Keras clips probabilities to [kProbEpsilon, 1 - kProbEpsilon]
// (keras.backend.epsilon()), and tf.clip_by_value passes the gradient only
// where the input lies inside the closed interval.

constexpr float kProbEpsilon = 1e-7f;
constexpr float kProbOneMinusEpsilon = static_cast<float>(1.0 - 1e-7);

struct LossAndGrad {
  float loss;
  float grad;  // d loss / d output
};

// tf.nn.sigmoid_cross_entropy_with_logits: max(z, 0) - z t + log(1 + e^-|z|).
struct BinaryCrossentropyFromLogits {
  DISTRAIN_HOST_DEVICE LossAndGrad operator()(float z, float t) const {
    const float loss = (z > 0.0f ? z : 0.0f) - z * t + log1pf(expf(-fabsf(z)));
    return {loss, Sigmoid()(z) - t};
  }
};

// Keras' binary_crossentropy on probabilities:
// -(t log(c) + (1 - t) log(1 - c)), c = clip(p).
struct BinaryCrossentropyFromProbs {
  DISTRAIN_HOST_DEVICE LossAndGrad operator()(float p, float t) const {
    const bool inside = p >= kProbEpsilon && p <= kProbOneMinusEpsilon;
    const float c =
        p < kProbEpsilon ? kProbEpsilon : (p > kProbOneMinusEpsilon ? kProbOneMinusEpsilon : p);
    const float loss = -(t * logf(c) + (1.0f - t) * logf(1.0f - c));
    const float grad = inside ? (1.0f - t) / (1.0f - c) - t / c : 0.0f;
    return {loss, grad};
  }
};

// (p - t)^2 and its derivative; MeanSquaredError averages over the row.
struct SquaredError {
  DISTRAIN_HOST_DEVICE LossAndGrad operator()(float p, float t) const {
    const float d = p - t;
    return {d * d, 2.0f * d};
  }
};

}  // namespace distrain::elementwise

#endif  // DISTRAIN_WORKER_TENSOR_ELEMENTWISE_H_
