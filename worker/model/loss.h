#ifndef DISTRAIN_WORKER_MODEL_LOSS_H_
#define DISTRAIN_WORKER_MODEL_LOSS_H_

#include <cstdint>

#include "absl/types/span.h"
#include "worker/tensor/tensor.h"

namespace distrain {

struct LossResult {
  double loss = 0;      // mean over the batch
  int64_t correct = 0;  // rows Keras' "accuracy" for the loss counts as right
};

// Softmax + sparse categorical cross-entropy on logits [batch, classes],
// numerically stable (log-sum-exp). The loss is the batch mean, so
// grad_logits = (softmax - onehot) / batch. grad_logits may be null (eval).
// Labels outside [0, classes) are a caller bug (datasets validate them).
LossResult SoftmaxCrossEntropy(const Tensor& logits, absl::Span<const int32_t> labels,
                               Tensor* grad_logits);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_LOSS_H_
