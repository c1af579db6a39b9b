#include "worker/ps/ps_wire.h"

#include <cstring>
#include <string>
#include <vector>

#include "distrain/v1/parameter_server.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace distrain::ps_wire {
namespace {

namespace v1 = ::distrain::v1;
using ::testing::HasSubstr;

std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `bytes` as a ByteBuffer cut into slices of the given sizes, cycling (so a
// varint or a chunk's data straddles slice boundaries).
grpc::ByteBuffer Sliced(const std::string& bytes, std::vector<size_t> cuts) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t i = 0; at < bytes.size(); ++i) {
    const size_t n = std::min(cuts[i % cuts.size()], bytes.size() - at);
    slices.emplace_back(bytes.data() + at, n);
    at += n;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string FloatBytes(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

struct ChunkSpec {
  int32_t index;
  int64_t offset;
  std::string data;
};

struct EncodingCase {
  const char* name;
  std::vector<v1::PulledShard> headers;
  std::vector<ChunkSpec> chunks;
};

TEST(PsWireTest, BuiltFramesAreProtobufsOwnEncoding) {
  v1::PulledShard a;
  a.set_index(0);
  a.mutable_ref()->set_variable("dense/kernel");
  a.mutable_ref()->set_shard(1);
  a.add_shape(3);
  a.add_shape(2);
  a.set_version(41);
  v1::PulledShard b;
  b.set_index(1);
  b.mutable_ref()->set_variable("b");
  const std::vector<EncodingCase> cases = {
      {"header only", {a}, {}},
      {"zero index and offset are left out", {a}, {{0, 0, FloatBytes({1, 2, 3})}}},
      {"several chunks",
       {a, b},
       {{0, 0, FloatBytes({1, 2})}, {0, 2, FloatBytes({3, 4})}, {1, 0, FloatBytes({5})}}},
      {"large offset and negative index", {}, {{-3, int64_t{1} << 40, FloatBytes({7})}}},
      {"empty data", {}, {{2, 5, ""}}},
      {"a megabyte", {b}, {{1, 9, std::string(1 << 20, '\x5a')}}},
  };
  for (const EncodingCase& c : cases) {
    v1::PullMessage want;
    FrameBuilder builder;
    for (const v1::PulledShard& h : c.headers) {
      *want.add_shards() = h;
      builder.AddMessage(kHeaderField, h);
    }
    for (const ChunkSpec& ch : c.chunks) {
      v1::DataChunk* d = want.add_chunks();
      d->set_index(ch.index);
      d->set_offset(ch.offset);
      d->set_data(ch.data);
      builder.AddChunk(ch.index, ch.offset, grpc::Slice(ch.data));
    }
    const std::string expected = want.SerializeAsString();
    EXPECT_EQ(builder.size(), static_cast<int64_t>(expected.size())) << c.name;
    grpc::ByteBuffer buffer = builder.Finish();
    EXPECT_TRUE(builder.empty()) << c.name;
    EXPECT_EQ(Bytes(buffer), expected) << c.name;
  }
}

TEST(PsWireTest, ParsesProtobufEncodingAcrossAnySliceBoundaries) {
  v1::UploadMessage m;
  v1::UploadShard* s = m.mutable_header()->add_shards();
  s->mutable_ref()->set_variable("w");
  s->set_num_elements(5);
  s->set_pulled_version(3);
  const std::vector<std::string> data = {FloatBytes({1.5f, -2, 3}), FloatBytes({4, 5}),
                                         std::string(3000, '\x11')};
  for (size_t i = 0; i < data.size(); ++i) {
    v1::DataChunk* c = m.add_chunks();
    c->set_index(static_cast<int32_t>(i));
    c->set_offset(static_cast<int64_t>(100 * i));
    c->set_data(data[i]);
  }
  const std::string bytes = m.SerializeAsString();
  for (const std::vector<size_t>& cuts :
       std::vector<std::vector<size_t>>{{bytes.size()}, {1}, {2, 3}, {7}, {1000, 1}, {4096}}) {
    const std::string what = "cuts of " + std::to_string(cuts[0]);
    Frame frame;
    ASSERT_TRUE(frame.Parse(Sliced(bytes, cuts)).ok()) << what;
    EXPECT_EQ(frame.size(), bytes.size()) << what;
    ASSERT_EQ(frame.headers().size(), 1u) << what;
    v1::UploadHeader header;
    ASSERT_TRUE(header.ParseFromString(frame.headers()[0])) << what;
    EXPECT_EQ(header.SerializeAsString(), m.header().SerializeAsString()) << what;
    ASSERT_EQ(frame.chunks().size(), data.size()) << what;
    for (size_t i = 0; i < data.size(); ++i) {
      const DecodedChunk& c = frame.chunks()[i];
      EXPECT_EQ(c.index, static_cast<int32_t>(i)) << what;
      EXPECT_EQ(c.offset, static_cast<int64_t>(100 * i)) << what;
      std::string got(c.data.size, '\0');
      frame.CopyTo(c.data, got.data());
      EXPECT_EQ(got, data[i]) << what << ", chunk " << i;
    }
  }
}

TEST(PsWireTest, UnknownFieldsAndMismatchedWireTypesAreSkippedLikeProtobuf) {
  std::string bytes;
  bytes += std::string("\x38\x05", 2);                       // field 7 varint
  bytes += std::string("\x45\x01\x02\x03\x04", 5);           // field 8 fixed32
  bytes += std::string("\x49", 1) + std::string(8, '\x01');  // field 9 fixed64
  bytes += std::string("\x52\x02xy", 4);                     // field 10 bytes
  bytes += std::string("\x10\x01", 2);                       // field 2 as a varint: unknown
  // A chunk {index 1, unknown field 9, offset 4, data "abcd"}, then data again: last wins.
  const std::string chunk = std::string(
      "\x08\x01\x48\x07\x10\x04\x1a\x04"
      "abcd\x1a\x04"
      "efgh",
      18);
  bytes += std::string("\x12", 1) + static_cast<char>(chunk.size()) + chunk;
  v1::UploadMessage reference;
  ASSERT_TRUE(reference.ParseFromString(bytes));
  ASSERT_EQ(reference.chunks_size(), 1);

  Frame frame;
  ASSERT_TRUE(frame.Parse(Sliced(bytes, {3})).ok());
  EXPECT_TRUE(frame.headers().empty());
  ASSERT_EQ(frame.chunks().size(), 1u);
  const DecodedChunk& c = frame.chunks()[0];
  EXPECT_EQ(c.index, reference.chunks(0).index());
  EXPECT_EQ(c.offset, reference.chunks(0).offset());
  std::string got(c.data.size, '\0');
  frame.CopyTo(c.data, got.data());
  EXPECT_EQ(got, reference.chunks(0).data());
}

TEST(PsWireTest, MalformedFramesAreRejectedWithTheirByteOffset) {
  struct Case {
    const char* name;
    std::string bytes;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"truncated tag", std::string("\x12\x00\x80", 3), "byte 2: truncated field tag"},
      {"field number 0", std::string("\x02\x00", 2), "byte 0: invalid field number"},
      {"group wire type", std::string("\x0b", 1), "byte 0: unsupported wire type"},
      {"wire type 6", std::string("\x0e", 1), "byte 0: unsupported wire type"},
      {"truncated length", std::string("\x12\xff", 2), "byte 0: truncated length"},
      {"length past the end", std::string("\x12\x05\x08\x01", 4),
       "byte 0: length runs past the end"},
      {"eleven-byte varint", std::string("\x38") + std::string(10, '\xff') + "\x01",
       "byte 0: truncated unknown field"},
      {"truncated unknown fixed64", std::string("\x39\x01\x02", 3),
       "byte 0: truncated unknown field"},
      {"data past the chunk", std::string("\x12\x03\x1a\x05\x00\x00\x00\x00\x00", 9),
       "byte 2: DataChunk.data runs past the end of the chunk"},
      {"truncated chunk offset", std::string("\x12\x02\x10\x80", 4),
       "byte 2: truncated DataChunk.offset"},
      {"group inside a chunk", std::string("\x12\x01\x0b", 3),
       "byte 2: unsupported wire type in DataChunk"},
  };
  for (const Case& c : cases) {
    v1::UploadMessage reference;
    EXPECT_FALSE(reference.ParseFromString(c.bytes)) << c.name << ": protobuf accepts it too";
    Frame frame;
    absl::Status s = frame.Parse(Sliced(c.bytes, {1}));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.name;
  }
}

}  // namespace
}  // namespace distrain::ps_wire
