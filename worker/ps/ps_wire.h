#ifndef DISTRAIN_WORKER_PS_PS_WIRE_H_
#define DISTRAIN_WORKER_PS_PS_WIRE_H_

// The parameter-server bulk messages (PullMessage, UploadMessage of
// proto/distrain/v1/parameter_server.proto) encoded and decoded by hand, so
// that tensor bytes move between a tensor and the socket without passing
// through protobuf `bytes` fields (TensorFlow's grpc tensor coding does the
// same for RecvTensorResponse).
//
// The bytes on the wire are exactly the protobuf encoding of the message —
// the proto stays the schema, and a peer that uses the generated stubs (or
// a hostile one) interoperates with these paths:
//   field 1 (length-delimited)  PullMessage.shards / UploadMessage.header,
//                               serialised by protobuf (small)
//   field 2 (length-delimited)  DataChunk { 1: index, 2: offset, 3: data },
//                               whose `data` is its own slice: the sender's
//                               buffer, not a copy
// Decoding walks the received slices in place; a DataChunk's data is
// returned as a byte range that the caller copies once, straight into its
// destination.
//
// Neither class is thread-safe; each is used by one RPC handler at a time.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace distrain::ps_wire {

// Field numbers shared by PullMessage and UploadMessage.
inline constexpr int kHeaderField = 1;  // PullMessage.shards, UploadMessage.header
inline constexpr int kChunksField = 2;  // repeated DataChunk chunks

// Builds one message as a ByteBuffer: small fields are gathered into one
// slice, each chunk's data rides as the slice it was given. Slices built with
// grpc::Slice::STATIC_SLICE borrow memory that must stay unchanged and alive
// until the synchronous Write of the buffer returned.
class FrameBuilder {
 public:
  // A length-delimited field holding `message` serialised.
  void AddMessage(int field, const google::protobuf::MessageLite& message);
  // A DataChunk in field kChunksField; `data` is not copied.
  void AddChunk(int32_t index, int64_t offset, grpc::Slice data);
  // Wire bytes so far.
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // The message; the builder is empty again afterwards.
  grpc::ByteBuffer Finish();

 private:
  void FlushHead();
  std::string head_;
  std::vector<grpc::Slice> slices_;
  int64_t size_ = 0;
};

// Bytes [offset, offset + size) of a parsed frame.
struct ByteRange {
  size_t offset = 0;
  size_t size = 0;
};

struct DecodedChunk {
  int32_t index = 0;
  int64_t offset = 0;
  ByteRange data;
};

// One received PullMessage or UploadMessage. Parse follows protobuf's rules
// (unknown fields skipped, the last occurrence of a singular field wins, a
// field with an unexpected wire type is an unknown field) and rejects what
// protobuf would reject: truncated varints, lengths past the end, group wire
// types, field number 0.
class Frame {
 public:
  // INVALID_ARGUMENT naming the byte offset of the first malformed field.
  absl::Status Parse(const grpc::ByteBuffer& buffer);
  // The serialised bytes of every field-1 occurrence, in order.
  const std::vector<std::string>& headers() const { return headers_; }
  const std::vector<DecodedChunk>& chunks() const { return chunks_; }
  // Copies the bytes of `range` (from Parse's buffer, kept alive here).
  void CopyTo(const ByteRange& range, void* dst) const;
  size_t size() const { return total_; }

 private:
  std::vector<grpc::Slice> slices_;
  std::vector<size_t> starts_;  // offset of each slice in the frame
  size_t total_ = 0;
  std::vector<std::string> headers_;
  std::vector<DecodedChunk> chunks_;
};

}  // namespace distrain::ps_wire

#endif  // DISTRAIN_WORKER_PS_PS_WIRE_H_
