#ifndef DISTRAIN_WORKER_MODEL_LAYER_FACTORY_H_
#define DISTRAIN_WORKER_MODEL_LAYER_FACTORY_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "common/model_spec.h"
#include "worker/model/layer.h"

namespace distrain {

// Builds the runtime layer for one validated LayerConfig (InferLayerShapes
// accepted it) whose per-example input shape is `input_shape`; `seed` seeds
// its initialisers (mixed with its name). Returns null for Input, which
// only declares the example shape. The caller owns the layer.
std::unique_ptr<Layer> MakeLayer(const LayerConfig& config,
                                 const std::vector<int64_t>& input_shape, uint64_t seed);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_MODEL_LAYER_FACTORY_H_
