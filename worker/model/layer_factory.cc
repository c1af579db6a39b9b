#include "worker/model/layer_factory.h"

#include "common/check.h"
#include "worker/model/activation_layer.h"
#include "worker/model/conv_layers.h"
#include "worker/model/dropout.h"
#include "worker/model/embedding.h"
#include "worker/model/normalization.h"
#include "worker/model/rescaling.h"
#include "worker/model/reshape_layers.h"

namespace distrain {

std::unique_ptr<Layer> MakeLayer(const LayerConfig& c, const std::vector<int64_t>& input_shape,
                                 uint64_t seed) {
  DISTRAIN_CHECK(!c.name.empty()) << LayerKindName(c.kind) << ": unnamed layer";
  DISTRAIN_CHECK(!input_shape.empty()) << c.name << ": empty input shape";
  switch (c.kind) {
    case LayerKind::kInput:
      return nullptr;
    case LayerKind::kReshape:
      return std::make_unique<Reshape>(c.name, c.shape);
    case LayerKind::kFlatten:
      return std::make_unique<Flatten>(c.name);
    case LayerKind::kDense:
      return std::make_unique<Dense>(c.name, input_shape.back(), c.units, seed, c.Activation(),
                                     c.use_bias);
    case LayerKind::kActivation:
    case LayerKind::kReLU:
    case LayerKind::kLeakyReLU:
    case LayerKind::kELU:
    case LayerKind::kSoftmax:
      return std::make_unique<Activation>(c.name, c.Activation(), c.kind);
    case LayerKind::kRescaling:
      return std::make_unique<Rescaling>(c.name, c.scale, c.offset);
    case LayerKind::kDropout:
      return std::make_unique<Dropout>(c.name, c.rate);
    case LayerKind::kConv2D:
      DISTRAIN_CHECK_EQ(input_shape.size(), 3u) << c.name << ": Conv2D needs [rows, cols, ch]";
      return std::make_unique<Conv2D>(c.name, input_shape[2], c.filters, c.kernel_size,
                                      c.EffectiveStrides(), c.padding, c.Activation(), c.use_bias,
                                      seed);
    case LayerKind::kConv1D:
      DISTRAIN_CHECK_EQ(input_shape.size(), 2u) << c.name << ": Conv1D needs [steps, ch]";
      return std::make_unique<Conv2D>(c.name, input_shape[1], c.filters, c.kernel_size,
                                      c.EffectiveStrides(), c.padding, c.Activation(), c.use_bias,
                                      seed, /*one_d=*/true);
    case LayerKind::kMaxPooling2D:
    case LayerKind::kAveragePooling2D:
    case LayerKind::kMaxPooling1D:
    case LayerKind::kAveragePooling1D:
      return std::make_unique<Pooling2D>(
          c.name,
          c.kind == LayerKind::kMaxPooling2D || c.kind == LayerKind::kMaxPooling1D
              ? ops::PoolKind::kMax
              : ops::PoolKind::kAverage,
          c.pool_size, c.EffectiveStrides(), c.padding, IsOneDimensional(c.kind));
    case LayerKind::kGlobalAveragePooling2D:
    case LayerKind::kGlobalAveragePooling1D:
      return std::make_unique<GlobalAveragePooling2D>(c.name, IsOneDimensional(c.kind));
    case LayerKind::kGlobalMaxPooling2D:
    case LayerKind::kGlobalMaxPooling1D:
      return Pooling2D::GlobalMax(c.name, IsOneDimensional(c.kind));
    case LayerKind::kBatchNormalization:
      return std::make_unique<BatchNormalization>(c.name, input_shape.back(), c.momentum,
                                                  c.epsilon);
    case LayerKind::kEmbedding:
      return std::make_unique<Embedding>(c.name, c.input_dim, c.output_dim, seed);
    case LayerKind::kLayerNormalization:
    case LayerKind::kRMSNormalization:
      return std::make_unique<LayerNormalization>(
          c.name, input_shape.back(), c.epsilon, c.center, c.scale_output,
          /*rms=*/c.kind == LayerKind::kRMSNormalization);
  }
  DISTRAIN_CHECK(false) << "unknown layer kind " << static_cast<int>(c.kind);
  return nullptr;
}

}  // namespace distrain
