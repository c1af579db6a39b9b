#ifndef DISTRAIN_WORKER_MODEL_INITIALIZERS_H_
#define DISTRAIN_WORKER_MODEL_INITIALIZERS_H_

// Keras' variable initialisers and the stable hashes that seed them and the
// layers' random streams. Deterministic across processes, builds and
// standard libraries: every replica that builds a model with the same seed
// gets bit-identical variables. Pure functions; thread-safe.

#include <cstdint>
#include <string>

#include "worker/tensor/tensor.h"

namespace distrain::init {

// FNV-1a of a string (std::hash differs between standard libraries).
uint64_t StableHash(const std::string& s);

// SplitMix64's finaliser: spreads nearby seeds (42, 43) over the whole state.
uint64_t Mix(uint64_t x);

// Keras' GlorotUniform: U(-limit, limit), limit = sqrt(6 / (fan_in +
// fan_out)), from a std::mt19937_64 seeded with `seed` (its raw 53 high bits:
// std::uniform_real_distribution is not specified bit for bit). For a Conv2D
// kernel [kh, kw, in, out] Keras' fans are kh*kw*in and kh*kw*out.
void GlorotUniform(uint64_t seed, int64_t fan_in, int64_t fan_out, Tensor* out);

// Keras' RandomUniform(minval, maxval) (Embedding's "uniform": -0.05, 0.05),
// drawn as GlorotUniform draws.
void RandomUniform(uint64_t seed, double minval, double maxval, Tensor* out);

}  // namespace distrain::init

#endif  // DISTRAIN_WORKER_MODEL_INITIALIZERS_H_
