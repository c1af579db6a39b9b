#ifndef DISTRAIN_TESTS_FUZZ_RING_SEED_KEY_H_
#define DISTRAIN_TESTS_FUZZ_RING_SEED_KEY_H_

// The key, nonces and group id that tests/fuzz/ring_handshake_fuzz.cc
// verifies with and tests/fuzz/make_seeds.cc signs its seeds with, so the
// seeds reach past the MAC check.

#include <cstdint>
#include <string_view>

namespace distrain::fuzz {

inline constexpr uint64_t kRingSeedGroupId = 0x5a17c0ffee5eed01ull;
inline constexpr std::string_view kRingSeedKey = "fuzz-ring-key-0123456789abcdef!!";
inline constexpr std::string_view kRingSeedAcceptorNonce = "acceptor-nonce-1";
inline constexpr std::string_view kRingSeedDiallerNonce = "dialler-nonce-01";

}  // namespace distrain::fuzz

#endif  // DISTRAIN_TESTS_FUZZ_RING_SEED_KEY_H_
