#include "worker/collective/ring_allreduce.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/collective/reduce_kernel.h"

namespace distrain {
namespace {

// All-reduce vectors above this size get their results with non-temporal
// stores (reduce_kernel.h StreamCopy); smaller ones with plain stores.
constexpr int64_t kStreamResultsAboveBytes = 8 << 20;

int Mod(int a, int n) { return ((a % n) + n) % n; }

// How far the operation header, which goes first on each of the two
// streams, has moved.
struct HeaderCursor {
  char* bytes;
  int64_t done = 0;

  bool complete() const { return done == kOpHeaderBytes; }
  // Adds the slice of what is left of it; returns that length.
  int64_t AddSlice(IoSlice* slices, int* count) const {
    if (complete()) return 0;
    slices[(*count)++] = IoSlice{bytes + done, static_cast<size_t>(kOpHeaderBytes - done)};
    return kOpHeaderBytes - done;
  }
  // Takes `moved` bytes of the stream; returns how many of them are payload.
  int64_t Advance(int64_t moved) {
    const int64_t h = std::min(moved, kOpHeaderBytes - done);
    done += h;
    return moved - h;
  }
};

}  // namespace

SlicedRingAllReduce::SlicedRingAllReduce(Transport& transport, const Operation& op,
                                         int64_t chunk_bytes, int stage_slices)
    : transport_(transport),
      op_(op),
      read_limit_(std::max<int64_t>(64, chunk_bytes)),
      // Whole floats per slice; reads may still end inside a float (they are
      // capped at chunk_bytes, which need not be a multiple of 4).
      slice_bytes_(std::max<int64_t>(64, chunk_bytes) & ~int64_t{3}),
      stage_bytes_(std::max(2, stage_slices) * slice_bytes_),
      stage_(std::make_unique<float[]>(stage_bytes_ / 4)) {
  segment_begin_.assign(transport.size(), 0);
  segment_bytes_.assign(transport.size(), 0);
}

absl::Status SlicedRingAllReduce::Run(const ByteVector& data, ReduceOp op, absl::Time deadline) {
  const int rank = transport_.rank();
  const int n = transport_.size();
  const int left = Mod(rank - 1, n);
  const int right = (rank + 1) % n;
  const int steps = 2 * (n - 1);
  const int64_t elements = data.size() / static_cast<int64_t>(sizeof(float));
  const int64_t slice = slice_bytes_;
  const int64_t stage_bytes = stage_bytes_;
  const int64_t read_limit = read_limit_;
  char* const stage = reinterpret_cast<char*>(stage_.get());
  int64_t longest = 0;
  for (int g = 0; g < n; ++g) {
    const int64_t lo = elements * g / n;
    const int64_t hi = elements * (g + 1) / n;
    segment_begin_[g] = lo * static_cast<int64_t>(sizeof(float));
    segment_bytes_[g] = (hi - lo) * static_cast<int64_t>(sizeof(float));
    longest = std::max(longest, segment_bytes_[g]);
  }
  const int64_t rounds = (longest + slice - 1) / slice;
  // Unit (round k, step t): slice k of the segment that step t carries.
  auto in_segment = [&](int t) { return Mod(rank - t - 1, n); };
  auto out_segment = [&](int t) { return Mod(rank - t, n); };
  auto unit_bytes = [&](int64_t k, int g) {
    return std::clamp<int64_t>(segment_bytes_[g] - k * slice, 0, slice);
  };
  int64_t in_total = 0, out_total = 0;
  for (int t = 0; t < steps; ++t) {
    in_total += segment_bytes_[in_segment(t)];
    out_total += segment_bytes_[out_segment(t)];
  }

  // A position in one of the two streams: unit (round, step), bytes into the
  // unit, and bytes into the stream's payload.
  struct Cursor {
    int64_t round = 0;
    int step = 0;
    int64_t offset = 0;
    int64_t position = 0;
  };
  // Moves `c` past finished and empty units; with `skip_last`, also past the
  // incoming last-step units, which are consumed here and never forwarded.
  auto settle = [&](Cursor& c, bool incoming, bool skip_last) {
    while (c.round < rounds) {
      const int64_t length =
          unit_bytes(c.round, incoming ? in_segment(c.step) : out_segment(c.step));
      const bool skip = skip_last && c.step == steps - 1;
      if (c.offset < length && !skip) return;
      if (skip) c.position += length - c.offset;
      c.offset = 0;
      if (++c.step == steps) {
        c.step = 0;
        ++c.round;
      }
    }
  };
  Cursor processed;  // incoming: received, reduced or copied into place
  Cursor forwarded;  // incoming: sent on (skips the last step's units)
  Cursor out;        // outgoing
  settle(processed, true, false);
  settle(forwarded, true, true);
  settle(out, false, false);
  int64_t received = 0;  // incoming payload bytes in the stage
  int64_t total_sent = 0, total_received = 0;
  const float divisor = static_cast<float>(n);
  const bool mean = op == ReduceOp::kMean;
  // Results go around the cache only when the vector is larger than a cache
  // could keep: a smaller one is still cached when the caller (an optimizer)
  // reads it next, and non-temporal stores would send it to memory first.
  const bool stream_results = data.size() > kStreamResultsAboveBytes;

  // Step 3: reduces or copies the received whole floats up to `limit`: the
  // stage keeps the value to forward, the caller's vector gets its own
  // contribution read and, from the last reduction on, the result.
  auto process = [&](int64_t limit) {
    while (processed.round < rounds && processed.position < limit) {
      const int t = processed.step;
      const int g = in_segment(t);
      const int64_t at = processed.position % stage_bytes;
      const int64_t want = std::min({unit_bytes(processed.round, g) - processed.offset,
                                     limit - processed.position, stage_bytes - at});
      int64_t length = 0;
      float* own = reinterpret_cast<float*>(
          data.Piece(segment_begin_[g] + processed.round * slice + processed.offset, want,
                     &length));
      float* staged = reinterpret_cast<float*>(stage + at);
      const size_t count = static_cast<size_t>(length) / sizeof(float);
      if (t < n - 1) {
        if (t == n - 2 && mean) {
          collective_internal::AddIntoAndDivide(staged, own, count, divisor);
        } else {
          collective_internal::AddInto(staged, own, count);
        }
      }
      if (t >= n - 2) {
        if (stream_results) {
          collective_internal::StreamCopy(own, staged, count);
        } else {
          std::memcpy(own, staged, count * sizeof(float));
        }
      }
      processed.offset += length;
      processed.position += length;
      settle(processed, true, false);
    }
  };
  // Steps 1 and 4: walks the outgoing stream from (o, f) over at most
  // `budget` bytes that can go now: step 0 from the caller's vector, later
  // steps from the stage once processed. Records the pieces when `slices` is
  // set (up to kMaxIoSlices).
  auto walk_send = [&](Cursor& o, Cursor& f, int64_t budget, IoSlice* slices, int* count) {
    int64_t walked = 0;
    while (o.round < rounds && budget > 0 && (slices == nullptr || *count < kMaxIoSlices)) {
      const int g = out_segment(o.step);
      int64_t take = std::min(unit_bytes(o.round, g) - o.offset, budget);
      char* p;
      if (o.step == 0) {
        p = data.Piece(segment_begin_[g] + o.round * slice + o.offset, take, &take);
      } else {
        const int64_t at = f.position % stage_bytes;
        take = std::min({take, processed.position - f.position, stage_bytes - at});
        if (take <= 0) break;
        p = stage + at;
        f.offset += take;
        f.position += take;
        settle(f, true, true);
      }
      if (slices != nullptr) slices[(*count)++] = IoSlice{p, static_cast<size_t>(take)};
      o.offset += take;
      o.position += take;
      walked += take;
      budget -= take;
      settle(o, false, false);
    }
    return walked;
  };
  // Step 2: the stage holds incoming bytes until they are processed and,
  // unless consumed by the last step, forwarded.
  auto room = [&] {
    const int64_t released = std::min(processed.position, forwarded.position);
    return std::min({released + stage_bytes - received, in_total - received, read_limit});
  };
  auto progress_text = [&] {
    return absl::StrCat("received ", total_received, " of ", kOpHeaderBytes + in_total,
                        " bytes from ", transport_.name(left), ", sent ", total_sent, " of ",
                        kOpHeaderBytes + out_total, " bytes to ", transport_.name(right));
  };
  Link& in = *transport_.ReceiveLink(left);
  Link& out_link = *transport_.SendLink(right);
  HeaderCursor header_in{reinterpret_cast<char*>(&in_header_)};
  // Sent from where the operation keeps it, never written.
  HeaderCursor header_out{const_cast<char*>(reinterpret_cast<const char*>(&op_.header()))};
  IoSlice slices[kMaxIoSlices];
  bool recv_ready = true;  // worth a call: optimistic at first, then as Wait says
  bool send_ready = true;
  auto receive_left = [&] { return !header_in.complete() || received < in_total; };
  auto send_left = [&] { return !header_out.complete() || out.round < rounds; };
  auto can_send = [&] {
    return !header_out.complete() ||
           (out.round < rounds && (out.step == 0 || processed.position > forwarded.position));
  };

  while (receive_left() || processed.round < rounds || send_left()) {
    if (transport_.aborted()) return absl::AbortedError("transport aborted");
    bool progressed = false;
    if (receive_left() && recv_ready && (!header_in.complete() || room() > 0)) {
      int count = 0;
      int64_t requested = header_in.AddSlice(slices, &count);
      const int64_t want = std::max<int64_t>(0, room());
      const int64_t at = received % stage_bytes;
      const int64_t first = std::min(want, stage_bytes - at);
      if (first > 0) slices[count++] = IoSlice{stage + at, static_cast<size_t>(first)};
      if (want > first) slices[count++] = IoSlice{stage, static_cast<size_t>(want - first)};
      requested += want;
      const IoResult r = in.TryReceive({slices, static_cast<size_t>(count)});
      if (r.code == IoResult::kMoved) {
        total_received += r.bytes;
        recv_ready = r.bytes == requested;  // a short read drained the link
        progressed = true;
        const bool had_header = header_in.complete();
        const int64_t rest = header_in.Advance(r.bytes);
        if (!had_header && header_in.complete()) {
          if (absl::Status s = op_.CheckHeader(in_header_, transport_.name(left)); !s.ok()) {
            return s;
          }
        }
        received += rest;
        process(received & ~int64_t{3});
      } else if (r.code == IoResult::kWouldBlock) {
        recv_ready = false;
      } else {
        return op_.LinkFailed(r, "from", transport_.name(left), progress_text());
      }
    }
    if (send_ready && can_send()) {
      int count = 0;
      int64_t requested = header_out.AddSlice(slices, &count);
      Cursor o = out, f = forwarded;
      requested += walk_send(o, f, out_total, slices, &count);
      const IoResult r = out_link.TrySend({slices, static_cast<size_t>(count)});
      if (r.code == IoResult::kMoved) {
        total_sent += r.bytes;
        send_ready = r.bytes == requested;  // a short write filled the link
        progressed = true;
        const int64_t rest = header_out.Advance(r.bytes);
        walk_send(out, forwarded, rest, nullptr, nullptr);
      } else if (r.code == IoResult::kWouldBlock) {
        send_ready = false;
      } else {
        return op_.LinkFailed(r, "to", transport_.name(right), progress_text());
      }
    }
    if (progressed) continue;

    // Step 5.
    const bool want_receive = receive_left() && (!header_in.complete() || room() > 0);
    const absl::Status w =
        transport_.WaitFor(want_receive ? &in : nullptr, can_send() ? &out_link : nullptr,
                           deadline, &recv_ready, &send_ready);
    if (absl::IsDeadlineExceeded(w)) {
      // With the stage full this rank can only go on once the right
      // neighbour takes bytes, whatever the left one does.
      return op_.RingTimedOut(transport_, want_receive, progress_text());
    }
    if (!w.ok()) return op_.WaitFailed(w);
  }
  return absl::OkStatus();
}

}  // namespace distrain
