#include "worker/strategy/host_staged_collective.h"

#include "worker/strategy/variable_state.h"

namespace distrain {

absl::Status HostStagedCollective::AllReduce(absl::Span<const absl::Span<float>> buffers,
                                             ReduceOp op, const CollectiveOptions& options) {
  size_t total = 0;
  for (const absl::Span<float>& b : buffers) total += b.size();
  if (host_.size() < total) host_.resize(total);
  // 1.
  size_t offset = 0;
  for (const absl::Span<float>& b : buffers) {
    CopyFloats(device_, b.data(), DeviceId::Cpu(), host_.data() + offset,
               static_cast<int64_t>(b.size()));
    offset += b.size();
  }
  // 2.
  if (absl::Status s = inner_->AllReduce(absl::MakeSpan(host_.data(), total), op, options);
      !s.ok()) {
    return s;
  }
  // 3.
  offset = 0;
  for (const absl::Span<float>& b : buffers) {
    CopyFloats(DeviceId::Cpu(), host_.data() + offset, device_, b.data(),
               static_cast<int64_t>(b.size()));
    offset += b.size();
  }
  return absl::OkStatus();
}

absl::Status HostStagedCollective::Broadcast(absl::Span<float> buffer, int root,
                                             const CollectiveOptions& options) {
  if (host_.size() < buffer.size()) host_.resize(buffer.size());
  const auto n = static_cast<int64_t>(buffer.size());
  if (rank() == root) CopyFloats(device_, buffer.data(), DeviceId::Cpu(), host_.data(), n);
  if (absl::Status s = inner_->Broadcast(absl::MakeSpan(host_.data(), buffer.size()), root, options);
      !s.ok()) {
    return s;
  }
  if (rank() != root) CopyFloats(DeviceId::Cpu(), host_.data(), device_, buffer.data(), n);
  return absl::OkStatus();
}

absl::Status HostStagedCollective::AllGather(absl::Span<const float> input,
                                             absl::Span<float> output,
                                             const CollectiveOptions& options) {
  // The host buffer holds the input, then the gathered output after it.
  const size_t need = input.size() + output.size();
  if (host_.size() < need) host_.resize(need);
  CopyFloats(device_, input.data(), DeviceId::Cpu(), host_.data(),
             static_cast<int64_t>(input.size()));
  absl::Span<float> gathered(host_.data() + input.size(), output.size());
  if (absl::Status s =
          inner_->AllGather(absl::MakeConstSpan(host_.data(), input.size()), gathered, options);
      !s.ok()) {
    return s;
  }
  CopyFloats(DeviceId::Cpu(), gathered.data(), device_, output.data(),
             static_cast<int64_t>(output.size()));
  return absl::OkStatus();
}

}  // namespace distrain
