// Fuzz target: the ring's connection handshake (worker/collective/ring.h
// ParseRingHello, ParseRingAck, ParseRingAddress), the bytes anything that
// reaches a MultiWorkerMirrored worker's ring port (or its store value) can
// send it. The first input byte picks the receiving side (a group of 2, 3 or
// 8; this rank 0, 1 or the last), the rest is the hello; the same bytes are
// then read as an ack and as a store value. Fixed key and nonces: a MAC the
// fuzzer cannot forge is still parsed and compared.
// Corpus: tests/fuzz/corpus/ring_handshake/ (hellos and acks as
// RingCollective sends them, from make_seeds.cc, which uses the key and
// nonces below).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tests/fuzz/ring_seed_key.h"
#include "worker/collective/ring.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static constexpr int kSizes[] = {2, 3, 8};
  const int group = kSizes[data[0] % 3];
  const int rank = (data[0] / 3) % 3 == 0 ? 0 : (data[0] / 3) % 3 == 1 ? 1 : group - 1;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  using distrain::fuzz::kRingSeedAcceptorNonce;
  using distrain::fuzz::kRingSeedDiallerNonce;
  using distrain::fuzz::kRingSeedGroupId;
  using distrain::fuzz::kRingSeedKey;
  std::string nonce;
  absl::StatusOr<int> from = distrain::ParseRingHello(bytes, kRingSeedGroupId, rank, group,
                                                      kRingSeedKey, kRingSeedAcceptorNonce, &nonce);
  if (from.ok() && (*from < 0 || *from >= group || *from == rank || nonce.size() != 16)) abort();
  (void)distrain::ParseRingAck(bytes, kRingSeedGroupId, (rank + 1) % group, kRingSeedKey,
                               kRingSeedDiallerNonce, kRingSeedAcceptorNonce);
  (void)distrain::ParseRingAddress(bytes);
  return 0;
}
