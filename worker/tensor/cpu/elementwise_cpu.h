#ifndef DISTRAIN_WORKER_TENSOR_CPU_ELEMENTWISE_CPU_H_
#define DISTRAIN_WORKER_TENSOR_CPU_ELEMENTWISE_CPU_H_

// The CPU backend's element-wise and row-wise kernels behind ops.h's
// activations, dropout and losses: loops over raw row-major float32 buffers
// that run the functors of worker/tensor/elementwise.h (ReLU keeps its
// hand-vectorised kernels in cpu_math.h; sparse cross-entropy from logits
// keeps cpu::SoftmaxCrossEntropy). Called only by worker/tensor/ops.cc.
//
// Conventions as cpu_math.h: sizes are element counts, outputs may alias
// inputs only where a function says so, nothing allocates. Reentrant.

#include <cstdint>

#include "common/model_spec.h"
#include "worker/tensor/elementwise.h"

namespace distrain::cpu {

// y = f(x) over x[rows, cols]; softmax is per row (max-shifted, so any finite
// logits give finite output). y may alias x.
void ActivationForward(ActivationFunction f, int64_t rows, int64_t cols, const float* x,
                       float* y);
// dx = dy * f'(x) given the forward input x and output y; each kind reads
// one of them (elementwise::GradientReadsInput; softmax reads y), the other
// may be null. dx may alias dy.
void ActivationBackward(ActivationFunction f, int64_t rows, int64_t cols, const float* x,
                        const float* y, const float* dy, float* dx);
// y = x * scale + offset (Rescaling). y may alias x.
void ScaleShift(int64_t n, float scale, float offset, const float* x, float* y);

// Layer (rms: RMS) normalisation of each row of x[rows, cols]
// (elementwise::NormOutput); gamma and beta [cols] may be null (1 and 0).
// mean and rstd [rows] receive each row's statistics for the backward pass.
void LayerNormForward(int64_t rows, int64_t cols, const float* x, const float* gamma,
                      const float* beta, float epsilon, bool rms, float* y, float* mean,
                      float* rstd);
// dx from dy and the forward pass's statistics; dgamma and dbeta [cols], when
// not null, receive the column sums of dy * xhat and dy. Nothing aliases.
void LayerNormBackward(int64_t rows, int64_t cols, const float* x, const float* dy,
                       const float* gamma, const float* mean, const float* rstd, bool rms,
                       float* dx, float* dgamma, float* dbeta);

// Embedding rows of table[vocab, dim] for n float ids (whole numbers in
// [0, vocab), CHECKed), and the table's gradient: dtable (overwritten) =
// per id, the sum of dy's rows in the ids' order.
void EmbeddingForward(int64_t n, int64_t vocab, int64_t dim, const float* ids,
                      const float* table, float* y);
void EmbeddingBackward(int64_t n, int64_t vocab, int64_t dim, const float* ids,
                       const float* dy, float* dtable);

// mask[i] = f(i); y = x * mask. y may alias x.
void DropoutForward(int64_t n, const elementwise::DropoutMask& f, const float* x, float* y,
                    float* mask);
// y = x rounded to bfloat16 / float16 values (elementwise.h); y may alias x.
void RoundToBfloat16(int64_t n, const float* x, float* y);
void RoundToFloat16(int64_t n, const float* x, float* y);
// y = ReLU(x) rounded to bfloat16 / float16 values in one pass: the same bits
// as Relu then RoundTo*, half the memory traffic. y may alias x.
void ReluRoundToBfloat16(int64_t n, const float* x, float* y);
void ReluRoundToFloat16(int64_t n, const float* x, float* y);
// Whether no element is NaN or infinite.
bool AllFinite(int64_t n, const float* x);

// dst = src (n floats, not overlapping), split across the thread's OpenMP
// team like the passes above (ops::Copy): a copy of megabytes on one thread
// leaves the other cores idle. (Flatten and pooling no longer copy: aliases
// and borrowed outputs, docs/architecture.md §6a.)
void CopyFloats(int64_t n, const float* src, float* dst);

// dx = dy * mask. dx may alias dy.
void Multiply(int64_t n, const float* a, const float* b, float* out);

// ---- Losses: each returns the loss summed over the rows (double) and, when
// grad is not null, writes grad_scale * d(row loss)/d(output). Labels must
// be valid for the loss (callers CHECK them).

// Keras' sparse_categorical_crossentropy on probabilities p[batch, classes]:
// log(sum_j c_j) - log(c_label), c = clip(p, eps, 1 - eps).
double SparseCrossentropyFromProbs(int64_t batch, int64_t classes, const float* p,
                                   const int32_t* labels, float grad_scale, float* grad);
// Keras' categorical_crossentropy on probabilities with one-hot targets:
// -log(clip(p_label / sum_j p_j)).
double CategoricalCrossentropyFromProbs(int64_t batch, int64_t classes, const float* p,
                                        const int32_t* labels, float grad_scale, float* grad);
// Keras' binary_crossentropy on out[batch] (width 1) with 0/1 labels.
double BinaryCrossentropy(bool from_logits, int64_t batch, const float* out,
                          const int32_t* labels, float grad_scale, float* grad);
// Keras' mean_squared_error per row of out[batch, width]: width > 1 against
// one-hot targets, width 1 against the label's value.
double MeanSquaredError(int64_t batch, int64_t width, const float* out, const int32_t* labels,
                        float grad_scale, float* grad);

// ---- Accuracy (Keras' metric for the loss) ----------------------------------
// Rows whose first argmax equals the label (sparse_categorical_accuracy and
// categorical_accuracy; ties go to the first index, as tf.argmax).
int64_t ArgmaxHits(int64_t batch, int64_t classes, const float* out, const int32_t* labels);
// Rows where (out > 0.5) == label (binary_accuracy's default threshold).
int64_t ThresholdHits(int64_t batch, const float* out, const int32_t* labels);

}  // namespace distrain::cpu

#endif  // DISTRAIN_WORKER_TENSOR_CPU_ELEMENTWISE_CPU_H_
