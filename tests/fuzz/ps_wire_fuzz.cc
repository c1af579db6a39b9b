// Fuzz target: the parameter server's hand-written frame decoder
// (worker/ps/ps_wire.h Frame::Parse), which reads every UploadMessage a ps
// receives (Initialize, Push) and every PullMessage a worker receives. The
// input is cut into gRPC slices at offsets taken from its first byte, since
// a frame arrives as several slices and fields may straddle them; then every
// header and chunk Parse returned is checked and copied out. Corpus:
// tests/fuzz/corpus/ps_wire/ (messages built by ps_wire::FrameBuilder, as
// the ps client sends them, from make_seeds.cc).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "worker/ps/ps_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const unsigned cut = data[0];  // slice length pattern: 1 + (cut + i) % 7, or whole when 0
  ++data;
  --size;
  std::vector<grpc::Slice> slices;
  for (size_t at = 0, i = 0; at < size; ++i) {
    const size_t n = cut == 0 ? size : std::min<size_t>(size - at, 1 + (cut + i) % 7);
    slices.emplace_back(data + at, n);
    at += n;
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  distrain::ps_wire::Frame frame;
  if (!frame.Parse(buffer).ok()) return 0;
  if (frame.size() != size) abort();
  for (const distrain::ps_wire::DecodedChunk& chunk : frame.chunks()) {
    if (chunk.data.offset > size || chunk.data.size > size - chunk.data.offset) abort();
    std::vector<char> out(chunk.data.size);
    frame.CopyTo(chunk.data, out.data());
  }
  return 0;
}
