#include "worker/model/layer.h"

#include <cmath>
#include <cstring>
#include <random>

#include "common/check.h"
#include "worker/tensor/cpu_math.h"

namespace distrain {
namespace {

// FNV-1a: a stable string hash (std::hash differs between standard libraries,
// and parameters must be bit-identical on every replica and every build).
uint64_t StableHash(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// SplitMix64 finaliser: spreads nearby seeds (42, 43) over the whole state.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Keras' GlorotUniform: U(-limit, limit), limit = sqrt(6 / (fan_in + fan_out)).
// std::mt19937_64 is fully specified by the standard; the uniform is derived
// from its raw 53 high bits because std::uniform_real_distribution is not.
void GlorotUniform(uint64_t seed, int64_t fan_in, int64_t fan_out, Tensor* out) {
  std::mt19937_64 gen(seed);
  const double limit = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  for (int64_t i = 0; i < out->size(); ++i) {
    const double u = static_cast<double>(gen() >> 11) * 0x1.0p-53;  // [0, 1)
    (*out)[i] = static_cast<float>((2.0 * u - 1.0) * limit);
  }
}

}  // namespace

Dense::Dense(std::string name, int64_t in_features, int64_t out_features, uint64_t seed)
    : name_(std::move(name)) {
  DISTRAIN_CHECK(in_features >= 1 && out_features >= 1)
      << name_ << ": in=" << in_features << " out=" << out_features;
  kernel_.name = name_ + "/kernel";
  kernel_.value = Tensor({in_features, out_features});
  kernel_.grad = Tensor({in_features, out_features});
  bias_.name = name_ + "/bias";
  bias_.value = Tensor({out_features});
  bias_.grad = Tensor({out_features});
  GlorotUniform(Mix(seed ^ StableHash(name_)), in_features, out_features, &kernel_.value);
}

std::vector<int64_t> Dense::OutputShape(const std::vector<int64_t>& input_shape) const {
  DISTRAIN_CHECK_EQ(input_shape.size(), 2u) << name_ << " expects [batch, features]";
  DISTRAIN_CHECK_EQ(input_shape[1], kernel_.value.dim(0)) << name_ << " input features";
  return {input_shape[0], kernel_.value.dim(1)};
}

void Dense::Forward(const Tensor& input, Tensor* output, const ForwardContext&) {
  const int64_t batch = input.dim(0);
  const int64_t in = kernel_.value.dim(0);
  const int64_t out = kernel_.value.dim(1);
  output->Resize(OutputShape(input.shape()));
  // Bias first, then one GEMM accumulating onto it (beta = 1): a single pass
  // over the output instead of GEMM + a separate bias pass.
  cpu::BroadcastRow(batch, out, bias_.value.data(), output->data());
  cpu::Gemm(false, false, batch, out, in, 1.0f, input.data(), kernel_.value.data(), 1.0f,
            output->data());
  input_ = &input;
  grad_output_ = nullptr;
}

void Dense::Backward(const Tensor& grad_output, Tensor* grad_input) {
  DISTRAIN_CHECK(input_ != nullptr) << name_ << ": Backward before Forward";
  const Tensor& input = *input_;
  const int64_t batch = input.dim(0);
  const int64_t in = kernel_.value.dim(0);
  const int64_t out = kernel_.value.dim(1);
  DISTRAIN_CHECK(grad_output.rank() == 2 && grad_output.dim(0) == batch &&
                 grad_output.dim(1) == out)
      << name_ << ": grad_output " << grad_output.ShapeString();
  // dW = x^T dy, db = sum over the batch of dy, dx = dy W^T.
  grad_output_ = &grad_output;
  if (!factored_) {
    cpu::Gemm(true, false, in, out, batch, 1.0f, input.data(), grad_output.data(), 0.0f,
              kernel_.grad.data());
  }
  cpu::ColumnSums(batch, out, grad_output.data(), bias_.grad.data());
  if (grad_input != nullptr) {
    grad_input->Resize({batch, in});
    cpu::Gemm(false, true, batch, in, out, 1.0f, grad_output.data(), kernel_.value.data(), 0.0f,
              grad_input->data());
  }
}

std::optional<GradFactors> Dense::KernelGradFactors() const {
  if (!factored_ || input_ == nullptr || grad_output_ == nullptr) return std::nullopt;
  return GradFactors{&kernel_, input_, grad_output_};
}

void ReLU::Forward(const Tensor& input, Tensor* output, const ForwardContext&) {
  output->Resize(input.shape());
  cpu::Relu(input.size(), input.data(), output->data());
  // A private copy (not a borrowed pointer) so callers may reuse `output`
  // before Backward; ~1 MB per step for the benchmark model.
  output_.Resize(input.shape());
  std::memcpy(output_.data(), output->data(), output->bytes());
}

void ReLU::Backward(const Tensor& grad_output, Tensor* grad_input) {
  DISTRAIN_CHECK(grad_output.SameShape(output_))
      << name_ << ": grad_output " << grad_output.ShapeString() << " vs output "
      << output_.ShapeString();
  if (grad_input == nullptr) return;
  grad_input->Resize(grad_output.shape());
  cpu::ReluGrad(grad_output.size(), output_.data(), grad_output.data(), grad_input->data());
}

}  // namespace distrain
