#include "worker/model/loss.h"

#include "common/check.h"
#include "worker/tensor/cpu_math.h"

namespace distrain {

LossResult SoftmaxCrossEntropy(const Tensor& logits, absl::Span<const int32_t> labels,
                               Tensor* grad_logits) {
  DISTRAIN_CHECK_EQ(logits.rank(), 2) << "logits " << logits.ShapeString();
  const int64_t batch = logits.dim(0);
  const int64_t classes = logits.dim(1);
  DISTRAIN_CHECK_EQ(static_cast<int64_t>(labels.size()), batch) << "one label per logits row";
  LossResult result;
  if (batch == 0) {
    if (grad_logits != nullptr) grad_logits->Resize(logits.shape());
    return result;
  }
  float* grad = nullptr;
  if (grad_logits != nullptr) {
    grad_logits->Resize(logits.shape());
    grad = grad_logits->data();
  }
  const double loss_sum =
      cpu::SoftmaxCrossEntropy(batch, classes, logits.data(), labels.data(),
                               1.0f / static_cast<float>(batch), grad, &result.correct);
  result.loss = loss_sum / static_cast<double>(batch);
  return result;
}

}  // namespace distrain
