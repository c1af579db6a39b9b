#ifndef DISTRAIN_WORKER_TENSOR_ELEMENTWISE_H_
#define DISTRAIN_WORKER_TENSOR_ELEMENTWISE_H_

// Element-wise math of the op seam (ops.h), written once as small functors
// that the CPU loops (worker/tensor/cpu/elementwise_cpu.cc) and the CUDA
// kernels (worker/tensor/cuda/, a later issue) both instantiate, so the two
// backends round the same formulas the same way (up to the libm each links).
//
// Every functor is a trivially copyable value with a const call operator and
// no state beyond its parameters; they are thread-safe. Only C math
// functions that CUDA also provides for device code (expf, expm1f, erff,
// tanhf, logf, log1pf) appear here.

#include <cmath>
#include <cstdint>

#include "common/model_spec.h"

#if defined(__CUDACC__)
#define DISTRAIN_HOST_DEVICE __host__ __device__
#else
#define DISTRAIN_HOST_DEVICE
#endif

namespace distrain::elementwise {

// ---- Activations -------------------------------------------------------------
// Forward functors map x to y; gradient functors map (saved value, dy) to dx,
// where the saved value is the forward output y where the derivative is
// cheapest in y (ReLU, sigmoid, tanh, ELU, SELU, leaky ReLU, ReLU6, hard
// sigmoid, exponential) and the input x for the rest (GELU, softplus,
// softsign, SiLU, hard SiLU, mish): SavesInput says which. Each formula is
// the one TensorFlow's kernel for Keras' activation computes (tf.nn.elu,
// tf.nn.selu, tf.math.softplus, tf.nn.silu, ...), and its gradient TF's
// registered gradient, so values and derivatives match Keras to rounding.

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

// ELU: x above 0, alpha (e^x - 1) below. From y: y > 0 exactly where x > 0,
// and below it d/dx alpha (e^x - 1) = alpha e^x = y + alpha.
struct Elu {
  float alpha;
  DISTRAIN_HOST_DEVICE float operator()(float x) const { return x > 0.0f ? x : alpha * expm1f(x); }
};
struct EluGrad {
  float alpha;
  DISTRAIN_HOST_DEVICE float operator()(float y, float dy) const {
    return y > 0.0f ? dy : dy * (y + alpha);
  }
};

// SELU (tf.nn.selu): scale * elu(x) with alpha = 1.6732632 and scale =
// 1.0507010, the self-normalising constants. The gradient is TF's SeluGrad:
// the negative branch for y < 0, the slope `scale` from 0 up.
constexpr float kSeluAlpha = 1.67326324235437728481f;
constexpr float kSeluScale = 1.05070098735548049342f;
struct Selu {
  DISTRAIN_HOST_DEVICE float operator()(float x) const {
    return x > 0.0f ? kSeluScale * x : kSeluScale * kSeluAlpha * expm1f(x);
  }
};
struct SeluGrad {
  DISTRAIN_HOST_DEVICE float operator()(float y, float dy) const {
    return y < 0.0f ? dy * (y + kSeluScale * kSeluAlpha) : dy * kSeluScale;
  }
};

// softplus = log(1 + e^x) as max(x, 0) + log1p(e^-|x|), finite for every
// finite x; d/dx = sigmoid(x).
struct Softplus {
  DISTRAIN_HOST_DEVICE float operator()(float x) const {
    return (x > 0.0f ? x : 0.0f) + log1pf(expf(-fabsf(x)));
  }
};
struct SoftplusGrad {
  DISTRAIN_HOST_DEVICE float operator()(float x, float dy) const { return dy * Sigmoid()(x); }
};

// softsign = x / (1 + |x|); d/dx = 1 / (1 + |x|)^2.
struct Softsign {
  DISTRAIN_HOST_DEVICE float operator()(float x) const { return x / (1.0f + fabsf(x)); }
};
struct SoftsignGrad {
  DISTRAIN_HOST_DEVICE float operator()(float x, float dy) const {
    const float d = 1.0f + fabsf(x);
    return dy / (d * d);
  }
};

// SiLU (swish) = x sigmoid(x); d/dx = s (1 + x (1 - s)).
struct Silu {
  DISTRAIN_HOST_DEVICE float operator()(float x) const { return x * Sigmoid()(x); }
};
struct SiluGrad {
  DISTRAIN_HOST_DEVICE float operator()(float x, float dy) const {
    const float s = Sigmoid()(x);
    return dy * (s * (1.0f + x * (1.0f - s)));
  }
};

// Keras 3's hard_sigmoid = relu6(x + 3) / 6: 0 up to -3, 1 from 3. Its
// slope 1/6 lies where the output is strictly inside (0, 1), as TF's
// Relu6Grad of x + 3 says.
struct HardSigmoid {
  DISTRAIN_HOST_DEVICE float operator()(float x) const {
    const float r = x + 3.0f;
    return (r > 0.0f ? (r < 6.0f ? r : 6.0f) : 0.0f) / 6.0f;
  }
};
struct HardSigmoidGrad {
  DISTRAIN_HOST_DEVICE float operator()(float y, float dy) const {
    return y > 0.0f && y < 1.0f ? dy / 6.0f : 0.0f;
  }
};

// hard_silu (hard_swish) = x hard_sigmoid(x); d/dx = hard_sigmoid(x) +
// x hard_sigmoid'(x).
struct HardSilu {
  DISTRAIN_HOST_DEVICE float operator()(float x) const { return x * HardSigmoid()(x); }
};
struct HardSiluGrad {
  DISTRAIN_HOST_DEVICE float operator()(float x, float dy) const {
    const float h = HardSigmoid()(x);
    return dy * h + x * HardSigmoidGrad()(h, dy);
  }
};

// Leaky ReLU (tf.nn.leaky_relu): x above 0, alpha x below (alpha >= 0, so
// y > 0 exactly where x > 0).
struct LeakyRelu {
  float alpha;
  DISTRAIN_HOST_DEVICE float operator()(float x) const { return x > 0.0f ? x : alpha * x; }
};
struct LeakyReluGrad {
  float alpha;
  DISTRAIN_HOST_DEVICE float operator()(float y, float dy) const {
    return y > 0.0f ? dy : alpha * dy;
  }
};

// ReLU6 = min(max(x, 0), 6); the gradient passes where 0 < x < 6, which is
// where 0 < y < 6 (TF's Relu6Grad).
struct Relu6 {
  DISTRAIN_HOST_DEVICE float operator()(float x) const {
    return x > 0.0f ? (x < 6.0f ? x : 6.0f) : 0.0f;
  }
};
struct Relu6Grad {
  DISTRAIN_HOST_DEVICE float operator()(float y, float dy) const {
    return y > 0.0f && y < 6.0f ? dy : 0.0f;
  }
};

// exponential = e^x, its own derivative.
struct Exponential {
  DISTRAIN_HOST_DEVICE float operator()(float x) const { return expf(x); }
};
struct ExponentialGrad {
  DISTRAIN_HOST_DEVICE float operator()(float y, float dy) const { return dy * y; }
};

// mish = x tanh(softplus(x)); d/dx = t + x sigmoid(x) (1 - t^2), t =
// tanh(softplus(x)) (softplus' = sigmoid).
struct Mish {
  DISTRAIN_HOST_DEVICE float operator()(float x) const { return x * tanhf(Softplus()(x)); }
};
struct MishGrad {
  DISTRAIN_HOST_DEVICE float operator()(float x, float dy) const {
    const float t = tanhf(Softplus()(x));
    return dy * (t + x * Sigmoid()(x) * (1.0f - t * t));
  }
};

// Whether a kind's gradient reads the forward input x (else the output y;
// linear reads neither, softmax y).
constexpr bool GradientReadsInput(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kGelu:
    case ActivationKind::kSoftplus:
    case ActivationKind::kSoftsign:
    case ActivationKind::kSilu:
    case ActivationKind::kHardSilu:
    case ActivationKind::kMish:
      return true;
    default:
      return false;
  }
}

// The backends' one switch over the element-wise kinds: calls
// visit(forward functor) (WithForwardFunctor) or visit(gradient functor)
// (WithGradientFunctor) and returns true, or returns false for linear and
// softmax, which the callers handle themselves (a copy; a row-wise kernel).
template <typename Visit>
bool WithForwardFunctor(ActivationFunction f, Visit&& visit) {
  switch (f.kind) {
    case ActivationKind::kRelu: visit(Relu()); return true;
    case ActivationKind::kSigmoid: visit(Sigmoid()); return true;
    case ActivationKind::kTanh: visit(Tanh()); return true;
    case ActivationKind::kGelu: visit(Gelu()); return true;
    case ActivationKind::kElu: visit(Elu{f.alpha}); return true;
    case ActivationKind::kSelu: visit(Selu()); return true;
    case ActivationKind::kSoftplus: visit(Softplus()); return true;
    case ActivationKind::kSoftsign: visit(Softsign()); return true;
    case ActivationKind::kSilu: visit(Silu()); return true;
    case ActivationKind::kHardSigmoid: visit(HardSigmoid()); return true;
    case ActivationKind::kHardSilu: visit(HardSilu()); return true;
    case ActivationKind::kLeakyRelu: visit(LeakyRelu{f.alpha}); return true;
    case ActivationKind::kRelu6: visit(Relu6()); return true;
    case ActivationKind::kExponential: visit(Exponential()); return true;
    case ActivationKind::kMish: visit(Mish()); return true;
    case ActivationKind::kLinear:
    case ActivationKind::kSoftmax:
      return false;
  }
  return false;
}
template <typename Visit>
bool WithGradientFunctor(ActivationFunction f, Visit&& visit) {
  switch (f.kind) {
    case ActivationKind::kRelu: visit(ReluGrad()); return true;
    case ActivationKind::kSigmoid: visit(SigmoidGrad()); return true;
    case ActivationKind::kTanh: visit(TanhGrad()); return true;
    case ActivationKind::kGelu: visit(GeluGrad()); return true;
    case ActivationKind::kElu: visit(EluGrad{f.alpha}); return true;
    case ActivationKind::kSelu: visit(SeluGrad()); return true;
    case ActivationKind::kSoftplus: visit(SoftplusGrad()); return true;
    case ActivationKind::kSoftsign: visit(SoftsignGrad()); return true;
    case ActivationKind::kSilu: visit(SiluGrad()); return true;
    case ActivationKind::kHardSigmoid: visit(HardSigmoidGrad()); return true;
    case ActivationKind::kHardSilu: visit(HardSiluGrad()); return true;
    case ActivationKind::kLeakyRelu: visit(LeakyReluGrad{f.alpha}); return true;
    case ActivationKind::kRelu6: visit(Relu6Grad()); return true;
    case ActivationKind::kExponential: visit(ExponentialGrad()); return true;
    case ActivationKind::kMish: visit(MishGrad()); return true;
    case ActivationKind::kLinear:
    case ActivationKind::kSoftmax:
      return false;
  }
  return false;
}

// ---- Affine --------------------------------------------------------------------

// Keras' Rescaling: x * scale + offset.
struct ScaleShift {
  float scale;
  float offset;
  DISTRAIN_HOST_DEVICE float operator()(float x) const { return x * scale + offset; }
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

// ---- Layer and RMS normalisation (per row) -----------------------------------
// ops::LayerNormForward/Backward normalise each row of x[m, c] on its own.
// Each backend reduces a row its own way (the CPU sequentially, CUDA over a
// block tree, both in double) into the row's statistics; the per-element
// math below is what both then run. `rms` is Keras' RMSNormalization: no
// centring, so mean is 0 and the row's mean gradient term drops out.

struct NormRow {
  float mean;  // 0 for rms
  float rstd;  // 1 / sqrt(var + eps); rms: 1 / sqrt(mean(x^2) + eps)
};

// Keras' order of operations (keras.ops.layer_normalization): inv = rstd *
// gamma, y = x * inv + (beta - mean * inv); rms (keras.ops.rms_normalization):
// y = (x * rstd) * gamma. An absent gamma is 1 and beta 0, which leave
// Keras' formula's values unchanged.
DISTRAIN_HOST_DEVICE inline float NormOutput(bool rms, float x, NormRow row, float gamma,
                                             float beta) {
  if (rms) return x * row.rstd * gamma;
  const float inv = row.rstd * gamma;
  return x * inv + (beta - row.mean * inv);
}

DISTRAIN_HOST_DEVICE inline float NormNormalized(float x, NormRow row) {
  return (x - row.mean) * row.rstd;
}

// dx of one element from g = dy * gamma, its normalised input xhat and the
// row's means of g and g * xhat (mean_g is 0 for rms):
// dx = rstd (g - mean(g) - xhat mean(g xhat)). The centred form is exact
// because the variance's derivative through the mean vanishes
// (tf.nn.moments stops that gradient for the same reason).
DISTRAIN_HOST_DEVICE inline float NormInputGrad(float g, float xhat, NormRow row, float mean_g,
                                                float mean_g_xhat) {
  return row.rstd * (g - mean_g - xhat * mean_g_xhat);
}

}  // namespace distrain::elementwise

#endif  // DISTRAIN_WORKER_TENSOR_ELEMENTWISE_H_
