// Fuzz target: the ring's connection handshake (worker/collective/ring.h
// ParseRingHello, ParseRingAck), the bytes anything that reaches a
// MultiWorkerMirrored worker's ring port can send it. The first input byte
// picks the receiving side (a group of 2, 3 or 8; this rank 0, 1 or the
// last), the rest is the hello; the same bytes are then read as an ack.
// Corpus: tests/fuzz/corpus/ring_handshake/ (hellos and acks as
// RingCollective sends them, from make_seeds.cc).

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "worker/collective/ring.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static constexpr int kSizes[] = {2, 3, 8};
  const int group = kSizes[data[0] % 3];
  const int rank = (data[0] / 3) % 3 == 0 ? 0 : (data[0] / 3) % 3 == 1 ? 1 : group - 1;
  // The group id of "mwms/g1" for that size is what a real group computes;
  // any constant serves, the parser compares it only.
  constexpr uint64_t kGroupId = 0x5a17c0ffee5eed01ull;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::StatusOr<int> from = distrain::ParseRingHello(bytes, kGroupId, rank, group);
  if (from.ok() && (*from < 0 || *from >= group || *from == rank)) abort();
  (void)distrain::ParseRingAck(bytes, kGroupId, (rank + 1) % group);
  return 0;
}
