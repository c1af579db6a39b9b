#ifndef DISTRAIN_WORKER_STRATEGY_PARAM_CHECKSUM_H_
#define DISTRAIN_WORKER_STRATEGY_PARAM_CHECKSUM_H_

// Parameter checksums for the DISTRAIN_PARAM_CHECKSUM_FILE test/debug hook
// (see strategy.h): replicas of a synchronous strategy must stay bit-identical,
// and comparing one 64-bit hash per step and process is how tests see it.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/model/model.h"

namespace distrain {

// FNV-1a (64-bit) over the bytes of every parameter value, in
// Model::parameters() order. Equal iff (with overwhelming probability) the
// models hold bit-identical parameters. A model on a GPU is hashed from host
// copies of its parameters, so the value does not depend on the device.
uint64_t ParameterChecksum(Model& model);

// The checksum of models[0] after checking that every model has the same
// one; Internal error naming the first replica that differs otherwise.
absl::StatusOr<uint64_t> ReplicaChecksum(absl::Span<Model* const> models);

// "%016x" of a checksum, as written to the checksum file.
std::string ChecksumHex(uint64_t checksum);

}  // namespace distrain

#endif  // DISTRAIN_WORKER_STRATEGY_PARAM_CHECKSUM_H_
