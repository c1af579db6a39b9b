#include "worker/collective/operation.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace distrain {
namespace {

constexpr uint32_t kHeaderMagic = 0x48435244;  // "DRCH"

const char* KindName(uint8_t kind) {
  switch (kind) {
    case 1:
      return "all-reduce";
    case 2:
      return "broadcast";
    case 3:
      return "all-gather";
    case 4:
      return "barrier";
  }
  return "unknown operation";
}

}  // namespace

void Operation::Begin(OpKind kind, ReduceOp op, int root, int64_t payload_bytes) {
  ++sequence_;
  header_ = OpHeader{kHeaderMagic,
                     static_cast<uint8_t>(kind),
                     static_cast<uint8_t>(op),
                     0,
                     sequence_,
                     root,
                     payload_bytes};
}

absl::Status Operation::CheckHeader(const OpHeader& in, const std::string& peer) const {
  const OpHeader& out = header_;
  if (in.magic != kHeaderMagic) {
    return absl::DataLossError(absl::StrCat(What(), ": ", peer,
                                            " sent bytes that are not a collective header; the "
                                            "group lost sync"));
  }
  if (in.kind != out.kind || in.op != out.op || in.sequence != out.sequence ||
      in.root != out.root || in.payload_bytes != out.payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        What(), ": ", peer, " runs ", KindName(in.kind), " #", in.sequence, " of ",
        in.payload_bytes, " bytes (op ", static_cast<int>(in.op), ", root ", in.root,
        ") but this rank runs ", KindName(out.kind), " #", out.sequence, " of ",
        out.payload_bytes, " bytes (op ", static_cast<int>(out.op), ", root ", out.root,
        "); every rank must issue the same collectives in the same order with the same sizes"));
  }
  return absl::OkStatus();
}

std::string Operation::What() const {
  return tag_ == nullptr || tag_->empty() ? absl::StrCat(name_, " #", sequence_)
                                          : absl::StrCat(name_, " '", *tag_, "' #", sequence_);
}

absl::Status Operation::LinkFailed(const IoResult& result, const char* direction,
                                   const std::string& peer, const std::string& progress) const {
  if (result.code == IoResult::kClosed) {
    return absl::UnavailableError(absl::StrCat(
        What(), ": ", peer, " closed the connection (", progress,
        "); that process exited or failed (possibly because of an earlier peer failure)"));
  }
  return absl::UnavailableError(absl::StrCat(What(), ": connection ", direction, " ", peer,
                                             " broke: ", result.reason, " (", progress, ")"));
}

absl::Status Operation::WaitFailed(const absl::Status& wait) const {
  return absl::Status(wait.code(), absl::StrCat(What(), ": ", wait.message()));
}

absl::Status Operation::RingTimedOut(const Transport& transport, bool waiting_for_left,
                                     const std::string& progress) const {
  const int rank = transport.rank();
  const int size = transport.size();
  const std::string waiting =
      waiting_for_left
          ? absl::StrCat("waiting for ", transport.name((rank + size - 1) % size), " to send")
          : absl::StrCat("waiting for ", transport.name((rank + 1) % size), " to receive");
  return absl::DeadlineExceededError(absl::StrCat(
      What(), " on ", transport.name(rank), " timed out ", waiting, " (", progress,
      "); the peer stopped, is stuck, or issued a different collective (a stall anywhere in "
      "the ring reaches every rank through its left neighbour)"));
}

// ---- ByteVector ------------------------------------------------------------

void ByteVector::Clear() {
  bases_.clear();
  ends_.clear();
}

void ByteVector::Add(void* data, int64_t bytes) {
  if (bytes <= 0) return;
  bases_.push_back(static_cast<char*>(data));
  ends_.push_back(size() + bytes);
}

char* ByteVector::Piece(int64_t position, int64_t max, int64_t* length) const {
  // Few regions (a bucket of gradients): upper_bound is cheap and simple.
  size_t i = std::upper_bound(ends_.begin(), ends_.end(), position) - ends_.begin();
  DISTRAIN_CHECK_LT(i, ends_.size()) << "position " << position;
  int64_t start = i == 0 ? 0 : ends_[i - 1];
  *length = std::min(max, ends_[i] - position);
  return bases_[i] + (position - start);
}

}  // namespace distrain
