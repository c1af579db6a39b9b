#include "worker/collective/mesh_algorithms.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "worker/collective/reduce_kernel.h"

namespace distrain {
namespace {

// The (header, payload) stream of one message from `offset` on, as at most
// two slices; returns how many.
int HeaderAndPayload(const OpHeader* header, const char* payload, int64_t payload_bytes,
                     int64_t offset, IoSlice* slices) {
  int count = 0;
  if (offset < kOpHeaderBytes) {
    // Sent from, or received into, memory the caller lends for the call.
    slices[count++] = IoSlice{const_cast<char*>(reinterpret_cast<const char*>(header)) + offset,
                              static_cast<size_t>(kOpHeaderBytes - offset)};
    offset = kOpHeaderBytes;
  }
  if (payload_bytes > 0) {
    const int64_t at = offset - kOpHeaderBytes;
    slices[count++] =
        IoSlice{const_cast<char*>(payload) + at, static_cast<size_t>(payload_bytes - at)};
  }
  return count;
}

}  // namespace

MeshAlgorithms::MeshAlgorithms(Transport& transport, const Operation& op,
                               absl::Duration busy_poll, int64_t slice_bytes)
    : transport_(transport),
      op_(op),
      busy_poll_(busy_poll),
      slice_bytes_(std::max<int64_t>(slice_bytes / sizeof(float), 16) * sizeof(float)) {
  DISTRAIN_CHECK(transport.fully_connected());
  const int size = transport.size();
  in_headers_.resize(size);
  sent_.assign(size, 0);
  got_.assign(size, 0);
  can_send_.assign(size, 0);
  can_receive_.assign(size, 0);
}

absl::Status MeshAlgorithms::OneHop(const char* out, char* const* in, int64_t bytes, int sender,
                                    absl::Time deadline) {
  const int rank = transport_.rank();
  const int size = transport_.size();
  const int64_t total = kOpHeaderBytes + bytes;
  const bool sending = sender < 0 || sender == rank;
  for (int p = 0; p < size; ++p) {
    const bool receiving = p != rank && (sender < 0 || sender == p);
    sent_[p] = p != rank && sending ? 0 : total;
    got_[p] = receiving ? 0 : total;
    // Optimistic first pass; afterwards only what Wait reports ready, so no
    // call is spent on kWouldBlock (small operations are syscall-bound).
    can_send_[p] = true;
    can_receive_[p] = true;
  }
  while (true) {
    if (transport_.aborted()) return absl::AbortedError("transport aborted");
    bool done = true;
    bool more = false;  // something may still progress without waiting
    for (int p = 0; p < size; ++p) {
      // 1. Each peer's stream on its own: one peer being slow does not hold
      // back the others.
      if (sent_[p] < total && can_send_[p]) {
        IoSlice slices[2];
        const int count = HeaderAndPayload(&op_.header(), out, bytes, sent_[p], slices);
        const IoResult r = transport_.SendLink(p)->TrySend({slices, static_cast<size_t>(count)});
        if (r.code == IoResult::kMoved) {
          sent_[p] += r.bytes;
          can_send_[p] = sent_[p] == total;  // short write: link full
        } else if (r.code == IoResult::kWouldBlock) {
          can_send_[p] = false;
        } else {
          return op_.LinkFailed(r, "to", transport_.name(p), "while sending");
        }
      }
      if (got_[p] < total && can_receive_[p]) {
        IoSlice slices[2];
        const int count = HeaderAndPayload(&in_headers_[p], in[p], bytes, got_[p], slices);
        const int64_t wanted = total - got_[p];
        const IoResult r =
            transport_.ReceiveLink(p)->TryReceive({slices, static_cast<size_t>(count)});
        if (r.code == IoResult::kMoved) {
          const bool had_header = got_[p] >= kOpHeaderBytes;
          got_[p] += r.bytes;
          can_receive_[p] = r.bytes == wanted;  // short read: drained for now
          if (!had_header && got_[p] >= kOpHeaderBytes) {
            if (absl::Status h = op_.CheckHeader(in_headers_[p], transport_.name(p)); !h.ok()) {
              return h;
            }
          }
        } else if (r.code == IoResult::kWouldBlock) {
          can_receive_[p] = false;
        } else {
          return op_.LinkFailed(r, "from", transport_.name(p),
                                r.code == IoResult::kClosed
                                    ? absl::StrCat("received ", got_[p], " of ", total,
                                                   " bytes from it")
                                    : "while receiving");
        }
      }
      const bool send_left = sent_[p] < total;
      const bool recv_left = got_[p] < total;
      done = done && !send_left && !recv_left;
      more = more || (send_left && can_send_[p]) || (recv_left && can_receive_[p]);
    }
    if (done) break;
    if (more) continue;

    // 2.
    waits_.clear();
    wait_peer_.clear();
    for (int p = 0; p < size; ++p) {
      if (sent_[p] < total) {
        waits_.push_back(LinkWait{transport_.SendLink(p), LinkWait::kSend});
        wait_peer_.push_back(p);
      }
      if (got_[p] < total) {
        waits_.push_back(LinkWait{transport_.ReceiveLink(p), LinkWait::kReceive});
        wait_peer_.push_back(p);
      }
    }
    const absl::Status w = transport_.Wait(absl::MakeSpan(waits_), deadline);
    if (!w.ok() && !absl::IsDeadlineExceeded(w)) return op_.WaitFailed(w);
    for (size_t i = 0; i < waits_.size(); ++i) {
      if (!waits_[i].ready) continue;
      const int p = wait_peer_[i];
      (waits_[i].direction == LinkWait::kSend ? can_send_ : can_receive_)[p] = true;
    }
    if (absl::IsDeadlineExceeded(w)) {
      // Direct links: the peers we still miss data from are the ones stuck.
      std::string silent, not_reading;
      for (int p = 0; p < size; ++p) {
        if (got_[p] < total) {
          absl::StrAppend(&silent, silent.empty() ? "" : ", ", transport_.name(p));
        }
        if (sent_[p] < total) {
          absl::StrAppend(&not_reading, not_reading.empty() ? "" : ", ", transport_.name(p));
        }
      }
      return absl::DeadlineExceededError(absl::StrCat(
          op_.What(), " on ", transport_.name(rank), " timed out waiting for ",
          silent.empty() ? absl::StrCat(not_reading, " to receive")
                         : absl::StrCat(silent, " to send"),
          "; the peer stopped, is stuck, or issued a different collective"));
    }
  }
  return absl::OkStatus();
}

absl::Status MeshAlgorithms::Exchange(int to, const char* out, int64_t out_bytes, int from,
                                      char* in, int64_t in_bytes, absl::Time deadline,
                                      float* accumulate) {
  const int64_t out_total = to >= 0 ? kOpHeaderBytes + out_bytes : 0;
  const int64_t in_total = from >= 0 ? kOpHeaderBytes + in_bytes : 0;
  // Payload bytes already added into `accumulate`; a receive asks for no
  // more than the piece after them, so each piece is added while cached.
  int64_t added = 0;
  const auto receive_end = [&] {
    return accumulate == nullptr ? in_total
                                 : kOpHeaderBytes + std::min(in_bytes, added + slice_bytes_);
  };
  const auto add_arrived = [&](int64_t got) {
    const int64_t arrived = got - kOpHeaderBytes;
    if (accumulate == nullptr || arrived < std::min(in_bytes, added + slice_bytes_)) return;
    const size_t from_float = static_cast<size_t>(added) / sizeof(float);
    collective_internal::AddInto(accumulate + from_float,
                                 reinterpret_cast<const float*>(in) + from_float,
                                 static_cast<size_t>(arrived - added) / sizeof(float));
    added = arrived;
  };
  Link* const send = to >= 0 ? transport_.SendLink(to) : nullptr;
  Link* const receive = from >= 0 ? transport_.ReceiveLink(from) : nullptr;
  int64_t sent = 0, got = 0;
  bool send_ready = true;
  bool recv_ready = false;  // wait first: it returns at once when the data is there
  bool spun = false;
  auto timeout_error = [&] {
    return absl::DeadlineExceededError(absl::StrCat(
        op_.What(), " on ", transport_.name(transport_.rank()), " timed out waiting for ",
        got < in_total ? absl::StrCat(transport_.name(from), " to send (received ", got, " of ",
                                      in_total, " bytes)")
                       : absl::StrCat(transport_.name(to), " to receive"),
        "; the peer stopped, is stuck, or issued a different collective"));
  };
  while (sent < out_total || got < in_total) {
    if (transport_.aborted()) return absl::AbortedError("transport aborted");
    if (sent < out_total && send_ready) {
      IoSlice slices[2];
      const int count = HeaderAndPayload(&op_.header(), out, out_bytes, sent, slices);
      const int64_t wanted = out_total - sent;
      const IoResult r = send->TrySend({slices, static_cast<size_t>(count)});
      if (r.code == IoResult::kMoved) {
        sent += r.bytes;
        send_ready = r.bytes == wanted;
      } else if (r.code == IoResult::kWouldBlock) {
        send_ready = false;
      } else {
        return op_.LinkFailed(r, "to", transport_.name(to), "while sending");
      }
    }
    // When only the receive is left, wait in the receive itself: one call
    // instead of Wait + receive, which is most of a small step's cost on
    // busy cores. Check briefly before sleeping, yielding the CPU in
    // between: a sleeping receiver adds a wake-up to every step.
    if (sent == out_total && got < in_total && !recv_ready &&
        busy_poll_ > absl::ZeroDuration() && !spun) {
      spun = true;
      if (receive->AwaitReadable(busy_poll_)) recv_ready = true;
    }
    const bool block = sent == out_total && got < in_total && !recv_ready;
    if (got < in_total && (recv_ready || block)) {
      IoSlice slices[2];
      const int64_t end = receive_end();
      const int count =
          HeaderAndPayload(&exchange_in_header_, in, end - kOpHeaderBytes, got, slices);
      const absl::Span<const IoSlice> wanted_slices(slices, static_cast<size_t>(count));
      const int64_t wanted = end - got;
      const IoResult r =
          block ? receive->Receive(wanted_slices, deadline) : receive->TryReceive(wanted_slices);
      if (r.code == IoResult::kMoved) {
        const bool had_header = got >= kOpHeaderBytes;
        got += r.bytes;
        recv_ready = r.bytes == wanted;
        spun = false;  // the rest may follow as quickly
        if (!had_header && got >= kOpHeaderBytes) {
          if (absl::Status h = op_.CheckHeader(exchange_in_header_, transport_.name(from));
              !h.ok()) {
            return h;
          }
        }
        if (got >= kOpHeaderBytes) add_arrived(got);
      } else if (r.code == IoResult::kWouldBlock) {
        recv_ready = false;
      } else if (r.code == IoResult::kTimedOut) {
        return timeout_error();
      } else {
        return op_.LinkFailed(
            r, "from", transport_.name(from),
            r.code == IoResult::kClosed
                ? absl::StrCat("received ", got, " of ", in_total, " bytes from it")
                : "while receiving");
      }
    }
    if (sent == out_total && got == in_total) break;
    if ((sent < out_total && send_ready) || (got < in_total && recv_ready)) continue;

    const absl::Status w =
        transport_.WaitFor(got < in_total ? receive : nullptr, sent < out_total ? send : nullptr,
                           deadline, &recv_ready, &send_ready);
    if (!w.ok() && !absl::IsDeadlineExceeded(w)) return op_.WaitFailed(w);
    if (absl::IsDeadlineExceeded(w)) return timeout_error();
  }
  return absl::OkStatus();
}

namespace {

// The ranks the recursive algorithms run on: the largest power of two <= n
// (the others are folded in first).
int PowerOfTwoAtMost(int n) {
  int pof2 = 1;
  while (pof2 * 2 <= n) pof2 *= 2;
  return pof2;
}

}  // namespace

int MeshAlgorithms::RealRank(int vrank) const {
  const int size = transport_.size();
  const int pof2 = PowerOfTwoAtMost(size);
  const int rest = size - pof2;
  return vrank < rest ? vrank * 2 + 1 : vrank + rest;
}

MeshAlgorithms::Workspace MeshAlgorithms::Prepare(absl::Span<const absl::Span<float>> buffers,
                                                   int64_t elements) {
  if (buffers.size() == 1) {
    work_.resize(static_cast<size_t>(elements));
    return Workspace{buffers[0].data(), work_.data(), false};
  }
  work_.resize(static_cast<size_t>(elements) * 2);
  float* p = work_.data();
  for (const absl::Span<float>& b : buffers) {
    if (!b.empty()) std::memcpy(p, b.data(), b.size() * sizeof(float));
    p += b.size();
  }
  return Workspace{work_.data(), work_.data() + elements, true};
}

void MeshAlgorithms::Finish(const Workspace& space,
                            absl::Span<const absl::Span<float>> buffers) const {
  if (!space.gathered) return;
  const float* p = space.work;
  for (const absl::Span<float>& b : buffers) {
    if (!b.empty()) std::memcpy(b.data(), p, b.size() * sizeof(float));
    p += b.size();
  }
}

absl::StatusOr<int> MeshAlgorithms::Fold(float* work, float* incoming, int64_t elements,
                                         absl::Time deadline) {
  const int rank = transport_.rank();
  const int size = transport_.size();
  const int pof2 = PowerOfTwoAtMost(size);
  const int rest = size - pof2;
  const int64_t bytes = elements * static_cast<int64_t>(sizeof(float));
  if (rank >= 2 * rest) return rank - rest;
  if (rank % 2 == 0) {
    if (absl::Status s = Exchange(rank + 1, reinterpret_cast<const char*>(work), bytes, -1,
                                  nullptr, 0, deadline);
        !s.ok()) {
      return s;
    }
    return -1;
  }
  if (absl::Status s = Exchange(-1, nullptr, 0, rank - 1, reinterpret_cast<char*>(incoming),
                                bytes, deadline, work);
      !s.ok()) {
    return s;
  }
  return rank / 2;
}

absl::Status MeshAlgorithms::Unfold(float* work, int64_t elements, absl::Time deadline) {
  const int rank = transport_.rank();
  const int size = transport_.size();
  const int pof2 = PowerOfTwoAtMost(size);
  const int rest = size - pof2;
  if (rank >= 2 * rest) return absl::OkStatus();
  const int64_t bytes = elements * static_cast<int64_t>(sizeof(float));
  char* const data = reinterpret_cast<char*>(work);
  return rank % 2 == 1 ? Exchange(rank - 1, data, bytes, -1, nullptr, 0, deadline)
                       : Exchange(-1, nullptr, 0, rank + 1, data, bytes, deadline);
}

absl::Status MeshAlgorithms::DoublingAllReduce(absl::Span<const absl::Span<float>> buffers,
                                               int64_t elements, ReduceOp op,
                                               absl::Time deadline) {
  const Workspace space = Prepare(buffers, elements);
  float* const work = space.work;
  float* const incoming = space.incoming;
  const int64_t bytes = elements * static_cast<int64_t>(sizeof(float));
  const int pof2 = PowerOfTwoAtMost(transport_.size());
  // 1.
  absl::StatusOr<int> vrank = Fold(work, incoming, elements, deadline);
  if (!vrank.ok()) return vrank.status();
  // 2. Recursive doubling.
  if (*vrank >= 0) {
    for (int mask = 1; mask < pof2; mask <<= 1) {
      const int partner = RealRank(*vrank ^ mask);
      if (absl::Status s = Exchange(partner, reinterpret_cast<const char*>(work), bytes, partner,
                                    reinterpret_cast<char*>(incoming), bytes, deadline);
          !s.ok()) {
        return s;
      }
      // Not added while arriving: `work` is still being sent.
      collective_internal::AddInto(work, incoming, static_cast<size_t>(elements));
    }
  }
  // 3.
  if (absl::Status s = Unfold(work, elements, deadline); !s.ok()) return s;
  if (op == ReduceOp::kMean) {
    collective_internal::DivideInPlace(work, static_cast<size_t>(elements),
                                       static_cast<float>(transport_.size()));
  }
  Finish(space, buffers);
  return absl::OkStatus();
}

absl::Status MeshAlgorithms::HalvingDoublingAllReduce(
    absl::Span<const absl::Span<float>> buffers, int64_t elements, ReduceOp op,
    absl::Time deadline) {
  const Workspace space = Prepare(buffers, elements);
  float* const work = space.work;
  float* const incoming = space.incoming;
  const int pof2 = PowerOfTwoAtMost(transport_.size());
  const auto bytes_of = [](int64_t n) { return n * static_cast<int64_t>(sizeof(float)); };
  // 1.
  absl::StatusOr<int> vrank = Fold(work, incoming, elements, deadline);
  if (!vrank.ok()) return vrank.status();
  if (*vrank >= 0) {
    // 2. Halving: [lo, hi) is the segment this rank still reduces; `levels`
    // remembers each step's whole segment for step 3 to retrace.
    int64_t lo = 0, hi = elements;
    std::vector<std::pair<int64_t, int64_t>> levels;
    for (int d = pof2 / 2; d >= 1; d /= 2) {
      const int partner = RealRank(*vrank ^ d);
      const int64_t mid = lo + (hi - lo) / 2;
      const bool lower = (*vrank & d) == 0;
      const int64_t keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
      const int64_t send_lo = lower ? mid : lo, send_hi = lower ? hi : mid;
      // The kept half is added while it arrives: only the other half is
      // being sent.
      if (absl::Status s = Exchange(partner, reinterpret_cast<const char*>(work + send_lo),
                                    bytes_of(send_hi - send_lo), partner,
                                    reinterpret_cast<char*>(incoming),
                                    bytes_of(keep_hi - keep_lo), deadline, work + keep_lo);
          !s.ok()) {
        return s;
      }
      levels.emplace_back(lo, hi);
      lo = keep_lo;
      hi = keep_hi;
    }
    // 3. This rank's block is final: divide it, then double back.
    if (op == ReduceOp::kMean) {
      collective_internal::DivideInPlace(work + lo, static_cast<size_t>(hi - lo),
                                         static_cast<float>(transport_.size()));
    }
    for (int d = 1; d < pof2; d *= 2) {
      const auto [level_lo, level_hi] = levels.back();
      levels.pop_back();
      const int partner = RealRank(*vrank ^ d);
      // The partner holds the other half of this level's segment.
      const int64_t other_lo = lo == level_lo ? hi : level_lo;
      const int64_t other_hi = lo == level_lo ? level_hi : lo;
      if (absl::Status s = Exchange(partner, reinterpret_cast<const char*>(work + lo),
                                    bytes_of(hi - lo), partner,
                                    reinterpret_cast<char*>(work + other_lo),
                                    bytes_of(other_hi - other_lo), deadline);
          !s.ok()) {
        return s;
      }
      lo = level_lo;
      hi = level_hi;
    }
  }
  // 4.
  if (absl::Status s = Unfold(work, elements, deadline); !s.ok()) return s;
  Finish(space, buffers);
  return absl::OkStatus();
}

}  // namespace distrain
