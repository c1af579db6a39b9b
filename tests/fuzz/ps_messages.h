#ifndef DISTRAIN_TESTS_FUZZ_PS_MESSAGES_H_
#define DISTRAIN_TESTS_FUZZ_PS_MESSAGES_H_

// Upload streams as PsClient sends them (worker/ps/ps_wire.h FrameBuilder),
// for the shards ps_service_fuzz.cc hosts: the start-up Initialize of that
// target and the seeds make_seeds.cc writes. Header-only.

#include <string>
#include <vector>

#include "distrain/v1/parameter_server.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "worker/ps/ps_wire.h"

namespace distrain::fuzz {

struct HostedShard {
  const char* variable;
  int index;
  int64_t elements;
};
// The hosted shards (ps_service_fuzz.cc HostedShards) with their element counts.
inline const std::vector<HostedShard>& HostedShardElements() {
  static const std::vector<HostedShard> shards = {{"dense/kernel", 0, 12},
                                                  {"dense/bias", 0, 3},
                                                  {"dense_1/kernel", 1, 6},
                                                  {"batch_normalization/moving_mean", 0, 3}};
  return shards;
}

inline std::string ToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// One upload of every hosted shard: the header message, then one message per
// shard with its values in chunks of `chunk_elements` (all `value`).
// `pulled_version` >= 0 sets it (a Push after a Pull).
inline std::vector<std::string> UploadStream(bool overwrite, int64_t pulled_version,
                                             int64_t chunk_elements, float value) {
  std::vector<std::string> messages;
  v1::UploadHeader header;
  header.set_overwrite(overwrite);
  for (const HostedShard& s : HostedShardElements()) {
    v1::UploadShard* us = header.add_shards();
    us->mutable_ref()->set_variable(s.variable);
    us->mutable_ref()->set_shard(s.index);
    us->set_num_elements(s.elements);
    if (pulled_version >= 0) us->set_pulled_version(pulled_version);
  }
  ps_wire::FrameBuilder first;
  first.AddMessage(ps_wire::kHeaderField, header);
  messages.push_back(ToString(first.Finish()));
  for (int i = 0; i < static_cast<int>(HostedShardElements().size()); ++i) {
    const int64_t n = HostedShardElements()[i].elements;
    ps_wire::FrameBuilder m;
    for (int64_t at = 0; at < n; at += chunk_elements) {
      const int64_t count = std::min(chunk_elements, n - at);
      std::vector<float> values(count, value);
      m.AddChunk(i, at, grpc::Slice(values.data(), values.size() * sizeof(float)));
    }
    messages.push_back(ToString(m.Finish()));
  }
  return messages;
}

}  // namespace distrain::fuzz

#endif  // DISTRAIN_TESTS_FUZZ_PS_MESSAGES_H_
