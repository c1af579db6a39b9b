#include "worker/model/loss.h"

#include "common/check.h"
#include "worker/tensor/ops.h"

namespace distrain {

LossResult SoftmaxCrossEntropy(const Tensor& logits, absl::Span<const int32_t> labels,
                               Tensor* grad_logits) {
  DISTRAIN_CHECK_EQ(logits.rank(), 2) << "logits " << logits.ShapeString();
  const int64_t batch = logits.dim(0);
  const float scale = batch > 0 ? 1.0f / static_cast<float>(batch) : 0.0f;
  const ops::LossSums sums = ops::Loss(LossKind::kSparseCategoricalCrossentropy,
                                       /*from_logits=*/true, logits, labels, scale, grad_logits);
  LossResult result;
  result.loss = batch > 0 ? sums.loss_sum / static_cast<double>(batch) : 0.0;
  result.correct = sums.correct;
  return result;
}

}  // namespace distrain
