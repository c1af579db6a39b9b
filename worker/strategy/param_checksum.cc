#include "worker/strategy/param_checksum.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/tensor/ops.h"

namespace distrain {

uint64_t ParameterChecksum(Model& model) {
  uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a offset basis
  Tensor host;  // a GPU replica's parameter, copied to the host to be hashed
  for (const Parameter* p : model.parameters()) {
    const Tensor* value = &p->value;
    if (!value->on_host()) {
      ops::Copy(*value, &host);
      value = &host;
    }
    const auto* bytes = reinterpret_cast<const unsigned char*>(value->data());
    for (int64_t i = 0; i < value->bytes(); ++i) {
      hash ^= bytes[i];
      hash *= 0x100000001b3ULL;  // FNV prime
    }
  }
  return hash;
}

absl::StatusOr<uint64_t> ReplicaChecksum(absl::Span<Model* const> models) {
  if (models.empty()) return absl::InternalError("no local replicas to checksum");
  const uint64_t first = ParameterChecksum(*models[0]);
  for (size_t r = 1; r < models.size(); ++r) {
    const uint64_t other = ParameterChecksum(*models[r]);
    if (other != first) {
      return absl::InternalError(absl::StrCat(
          "local replica ", r, " diverged from replica 0 (parameter checksum ", ChecksumHex(other),
          " vs ", ChecksumHex(first), "): synchronous replicas must stay bit-identical"));
    }
  }
  return first;
}

std::string ChecksumHex(uint64_t checksum) { return absl::StrFormat("%016x", checksum); }

}  // namespace distrain
