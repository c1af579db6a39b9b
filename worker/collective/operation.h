#ifndef DISTRAIN_WORKER_COLLECTIVE_OPERATION_H_
#define DISTRAIN_WORKER_COLLECTIVE_OPERATION_H_

// What RingCollective's algorithms (ring_allreduce.h, ring_pipeline.h,
// mesh_algorithms.h) share about the call in flight: the header that
// precedes its bytes on every link, and the wording of its errors.
//
// Every message starts with a 24-byte header {magic, kind, op, sequence
// number, root, payload bytes}, checked by the receiver as soon as it has
// arrived, so ranks that call different collectives (or the same one with
// other sizes) fail with InvalidArgument naming the peer instead of reducing
// garbage.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/collective/collective.h"
#include "worker/collective/transport.h"

namespace distrain {

enum class OpKind : uint8_t { kAllReduce = 1, kBroadcast, kAllGather, kBarrier };

struct OpHeader {
  uint32_t magic;
  uint8_t kind;
  uint8_t op;
  uint16_t reserved;
  uint32_t sequence;
  int32_t root;
  int64_t payload_bytes;
};
static_assert(sizeof(OpHeader) == 24);
inline constexpr int64_t kOpHeaderBytes = sizeof(OpHeader);

// The collective call this rank is running. Owned by RingCollective and
// shared (by reference) with its algorithms; used by the operation thread
// only.
class Operation {
 public:
  // Starts the next call: advances the sequence number and writes the
  // header every link carries first.
  void Begin(OpKind kind, ReduceOp op, int root, int64_t payload_bytes);
  // Names the call in errors; `tag` (options.tag) must outlive it.
  void Name(const char* name, const std::string* tag) {
    name_ = name;
    tag_ = tag;
  }

  const OpHeader& header() const { return header_; }
  // OK when `in`, a peer's header, announces the same call as ours.
  absl::Status CheckHeader(const OpHeader& in, const std::string& peer) const;

  // "all-reduce 'grads' #12". Built only on the error path, so that steady
  // state does not allocate.
  std::string What() const;
  // A link to or from `peer` failed (kClosed or kBroken); `direction` is
  // "to" or "from", `progress` says how far the call got.
  absl::Status LinkFailed(const IoResult& result, const char* direction, const std::string& peer,
                          const std::string& progress) const;
  // Transport::Wait failed (not a timeout).
  absl::Status WaitFailed(const absl::Status& wait) const;
  // A ring transfer (ring_allreduce.h, ring_pipeline.h) that passed its
  // deadline, blamed on the left neighbour (it sends nothing) or the right
  // one (it takes nothing).
  absl::Status RingTimedOut(const Transport& transport, bool waiting_for_left,
                            const std::string& progress) const;

 private:
  OpHeader header_{};
  uint32_t sequence_ = 0;
  const char* name_ = "";
  const std::string* tag_ = nullptr;
};

// A logical byte vector made of contiguous regions (the caller's buffers, or
// scratch of the algorithm). Does not own the regions.
class ByteVector {
 public:
  void Clear();
  void Add(void* data, int64_t bytes);
  int64_t size() const { return ends_.empty() ? 0 : ends_.back(); }
  // The contiguous run at `position`, at most `max` bytes long.
  char* Piece(int64_t position, int64_t max, int64_t* length) const;

 private:
  std::vector<char*> bases_;
  std::vector<int64_t> ends_;  // cumulative
};

}  // namespace distrain

#endif  // DISTRAIN_WORKER_COLLECTIVE_OPERATION_H_
