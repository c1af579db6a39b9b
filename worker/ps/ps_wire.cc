#include "worker/ps/ps_wire.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace distrain::ps_wire {

namespace {

enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void PutTag(std::string& out, int field, WireType type) {
  PutVarint(out, (static_cast<uint64_t>(field) << 3) | type);
}

// Reads forward through a frame's slices between two absolute offsets.
class Cursor {
 public:
  Cursor(const std::vector<grpc::Slice>& slices, const std::vector<size_t>& starts, size_t begin,
         size_t end)
      : slices_(slices), starts_(starts), pos_(begin), end_(end) {
    Seek(begin);
  }

  size_t pos() const { return pos_; }
  bool done() const { return pos_ >= end_; }

  bool ReadVarint(uint64_t* v) {
    uint64_t result = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (pos_ >= end_) return false;
      const uint8_t byte = Byte();
      Advance(1);
      // The tenth byte may only carry the top bit of a 64-bit value.
      if (shift == 63 && byte > 1) return false;
      result |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        *v = result;
        return true;
      }
    }
    return false;
  }

  bool Skip(uint64_t n) {
    if (n > end_ - pos_) return false;
    Advance(static_cast<size_t>(n));
    return true;
  }

 private:
  uint8_t Byte() const {
    return static_cast<uint8_t>(slices_[slice_].begin()[pos_ - starts_[slice_]]);
  }
  void Seek(size_t pos) {
    pos_ = pos;
    slice_ = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), pos) -
                                 starts_.begin());
    slice_ = slice_ == 0 ? 0 : slice_ - 1;
    Normalize();
  }
  void Advance(size_t n) {
    pos_ += n;
    Normalize();
  }
  // Moves slice_ to the slice holding pos_ (skipping empty slices).
  void Normalize() {
    while (slice_ + 1 < slices_.size() && pos_ >= starts_[slice_] + slices_[slice_].size()) {
      ++slice_;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  const std::vector<size_t>& starts_;
  size_t pos_;
  const size_t end_;
  size_t slice_ = 0;
};

}  // namespace

void FrameBuilder::AddMessage(int field, const google::protobuf::MessageLite& message) {
  const size_t n = message.ByteSizeLong();
  const size_t before = head_.size();
  PutTag(head_, field, kLengthDelimited);
  PutVarint(head_, n);
  const size_t at = head_.size();
  head_.resize(at + n);
  DISTRAIN_CHECK(message.SerializeToArray(head_.data() + at, static_cast<int>(n)));
  size_ += static_cast<int64_t>(head_.size() - before);
}

void FrameBuilder::AddChunk(int32_t index, int64_t offset, grpc::Slice data) {
  const uint64_t index_bits = static_cast<uint64_t>(static_cast<int64_t>(index));
  const uint64_t offset_bits = static_cast<uint64_t>(offset);
  // proto3 leaves zero-valued scalars out; so do we, so that the bytes equal
  // protobuf's own encoding of the same DataChunk.
  size_t body = 0;
  if (index != 0) body += 1 + VarintSize(index_bits);
  if (offset != 0) body += 1 + VarintSize(offset_bits);
  if (data.size() > 0) body += 1 + VarintSize(data.size()) + data.size();
  const size_t before = head_.size();
  PutTag(head_, kChunksField, kLengthDelimited);
  PutVarint(head_, body);
  if (index != 0) {
    PutTag(head_, 1, kVarint);
    PutVarint(head_, index_bits);
  }
  if (offset != 0) {
    PutTag(head_, 2, kVarint);
    PutVarint(head_, offset_bits);
  }
  if (data.size() > 0) {
    PutTag(head_, 3, kLengthDelimited);
    PutVarint(head_, data.size());
    size_ += static_cast<int64_t>(head_.size() - before + data.size());
    FlushHead();
    slices_.push_back(std::move(data));
  } else {
    size_ += static_cast<int64_t>(head_.size() - before);
  }
}

void FrameBuilder::FlushHead() {
  if (head_.empty()) return;
  slices_.emplace_back(head_);
  head_.clear();
}

grpc::ByteBuffer FrameBuilder::Finish() {
  FlushHead();
  grpc::ByteBuffer buffer(slices_.data(), slices_.size());
  slices_.clear();
  size_ = 0;
  return buffer;
}

absl::Status Frame::Parse(const grpc::ByteBuffer& buffer) {
  slices_.clear();
  starts_.clear();
  headers_.clear();
  chunks_.clear();
  total_ = 0;
  if (grpc::Status s = buffer.Dump(&slices_); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("unreadable message: ", s.error_message()));
  }
  for (const grpc::Slice& s : slices_) {
    starts_.push_back(total_);
    total_ += s.size();
  }
  auto bad = [](size_t at, const char* what) {
    return absl::InvalidArgumentError(absl::StrCat("malformed message at byte ", at, ": ", what));
  };
  // Skips a field's value of `type`; false when it runs past the end.
  auto skip = [](Cursor& c, uint32_t type) {
    uint64_t v;
    switch (type) {
      case kVarint:
        return c.ReadVarint(&v);
      case kFixed64:
        return c.Skip(8);
      case kFixed32:
        return c.Skip(4);
      case kLengthDelimited:
        return c.ReadVarint(&v) && c.Skip(v);
      default:
        return false;
    }
  };
  Cursor top(slices_, starts_, 0, total_);
  while (!top.done()) {
    const size_t at = top.pos();
    uint64_t tag;
    if (!top.ReadVarint(&tag)) return bad(at, "truncated field tag");
    const uint64_t field = tag >> 3;
    const uint32_t type = static_cast<uint32_t>(tag & 7);
    if (field == 0 || field > 0x1fffffff) return bad(at, "invalid field number");
    if (type == kStartGroup || type == kEndGroup || type > kFixed32) {
      return bad(at, "unsupported wire type (groups are not part of this schema)");
    }
    if (type != kLengthDelimited || (field != kHeaderField && field != kChunksField)) {
      if (!skip(top, type)) return bad(at, "truncated unknown field");
      continue;
    }
    uint64_t length;
    if (!top.ReadVarint(&length)) return bad(at, "truncated length");
    const size_t body = top.pos();
    if (length > total_ - body) return bad(at, "length runs past the end of the message");
    const size_t end = body + static_cast<size_t>(length);
    if (field == kHeaderField) {
      std::string& out = headers_.emplace_back(static_cast<size_t>(length), '\0');
      CopyTo(ByteRange{body, static_cast<size_t>(length)}, out.data());
      top.Skip(length);
      continue;
    }
    DecodedChunk chunk;
    Cursor c(slices_, starts_, body, end);
    while (!c.done()) {
      const size_t cat = c.pos();
      uint64_t ctag;
      if (!c.ReadVarint(&ctag)) return bad(cat, "truncated DataChunk field tag");
      const uint64_t cfield = ctag >> 3;
      const uint32_t ctype = static_cast<uint32_t>(ctag & 7);
      if (cfield == 0 || cfield > 0x1fffffff) return bad(cat, "invalid DataChunk field number");
      if (ctype == kStartGroup || ctype == kEndGroup || ctype > kFixed32) {
        return bad(cat, "unsupported wire type in DataChunk");
      }
      uint64_t v;
      if (cfield == 1 && ctype == kVarint) {
        if (!c.ReadVarint(&v)) return bad(cat, "truncated DataChunk.index");
        chunk.index = static_cast<int32_t>(static_cast<uint32_t>(v));
      } else if (cfield == 2 && ctype == kVarint) {
        if (!c.ReadVarint(&v)) return bad(cat, "truncated DataChunk.offset");
        chunk.offset = static_cast<int64_t>(v);
      } else if (cfield == 3 && ctype == kLengthDelimited) {
        if (!c.ReadVarint(&v)) return bad(cat, "truncated DataChunk.data length");
        const size_t data_at = c.pos();
        if (!c.Skip(v)) return bad(cat, "DataChunk.data runs past the end of the chunk");
        chunk.data = ByteRange{data_at, static_cast<size_t>(v)};
      } else if (!skip(c, ctype)) {
        return bad(cat, "truncated unknown DataChunk field");
      }
    }
    chunks_.push_back(chunk);
    top.Skip(length);
  }
  return absl::OkStatus();
}

void Frame::CopyTo(const ByteRange& range, void* dst) const {
  DISTRAIN_CHECK(range.offset + range.size <= total_);
  if (range.size == 0) return;
  char* out = static_cast<char*>(dst);
  size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), range.offset) -
                                 starts_.begin()) -
             1;
  size_t pos = range.offset;
  size_t left = range.size;
  while (left > 0) {
    const grpc::Slice& s = slices_[i];
    const size_t in = pos - starts_[i];
    const size_t n = std::min(left, s.size() - in);
    std::memcpy(out, s.begin() + in, n);
    out += n;
    pos += n;
    left -= n;
    ++i;
  }
}

}  // namespace distrain::ps_wire
