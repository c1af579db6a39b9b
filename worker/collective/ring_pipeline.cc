#include "worker/collective/ring_pipeline.h"

#include "absl/strings/str_cat.h"

namespace distrain {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

RingPipeline::RingPipeline(Transport& transport, const Operation& op)
    : transport_(transport), op_(op) {
  // The header is sent from where the operation keeps it: never written here.
  header_out_.Add(const_cast<OpHeader*>(&op_.header()), kOpHeaderBytes);
  header_in_.Add(&in_header_, kOpHeaderBytes);
}

void RingPipeline::Clear() {
  send_units_.clear();
  receive_units_.clear();
}

void RingPipeline::AddSendHeader() { AddSend(&header_out_, 0, kOpHeaderBytes, -1); }

void RingPipeline::AddReceiveHeader() {
  AddReceiveUnit(&header_in_, 0, kOpHeaderBytes, Mode::kHeader);
}

void RingPipeline::AddSend(const ByteVector* vector, int64_t begin, int64_t length,
                           int depends_on) {
  send_units_.push_back(SendUnit{vector, begin, length, depends_on});
}

int RingPipeline::AddReceive(ByteVector* vector, int64_t begin, int64_t length) {
  return AddReceiveUnit(vector, begin, length, Mode::kCopy);
}

int RingPipeline::AddReceiveUnit(ByteVector* vector, int64_t begin, int64_t length, Mode mode) {
  receive_units_.push_back(ReceiveUnit{vector, begin, length, mode});
  return static_cast<int>(receive_units_.size()) - 1;
}

void RingPipeline::PlanAllGather(ByteVector* vector, int64_t block_bytes) {
  const int rank = transport_.rank();
  const int size = transport_.size();
  AddSendHeader();
  AddReceiveHeader();
  int previous = -1;
  for (int t = 0; t < size - 1; ++t) {
    AddSend(vector, Mod(rank - t, size) * block_bytes, block_bytes, previous);
    previous = AddReceive(vector, Mod(rank - t - 1, size) * block_bytes, block_bytes);
  }
}

absl::Status RingPipeline::Run(absl::Time deadline) {
  const int rank = transport_.rank();
  const int size = transport_.size();
  const int left = Mod(rank - 1, size);
  const int right = (rank + 1) % size;
  Link& in = *transport_.ReceiveLink(left);
  Link& out = *transport_.SendLink(right);
  const int num_send = static_cast<int>(send_units_.size());
  const int num_recv = static_cast<int>(receive_units_.size());
  int s = 0, v = 0;           // current units
  int64_t sent = 0, got = 0;  // bytes done in them
  int64_t total_sent = 0, total_received = 0;
  IoSlice slices[kMaxIoSlices];
  // Worth a call: optimistic at first, then as Wait reports.
  bool recv_ready = true;
  bool send_ready = true;
  int64_t moved = 0;  // bytes moved before this pass

  auto progress_text = [&] {
    int64_t want_in = 0, want_out = 0;
    for (const ReceiveUnit& u : receive_units_) want_in += u.length;
    for (const SendUnit& u : send_units_) want_out += u.length;
    return absl::StrCat("received ", total_received, " of ", want_in, " bytes from ",
                        transport_.name(left), ", sent ", total_sent, " of ", want_out,
                        " bytes to ", transport_.name(right));
  };
  // How far send unit u may go: a dependent unit trails its receive unit.
  auto allowed = [&](int u) -> int64_t {
    const SendUnit& unit = send_units_[u];
    if (unit.depends_on < v) return unit.length;  // includes depends_on == -1
    return unit.depends_on == v ? got : 0;
  };

  while (true) {
    while (v < num_recv && got == receive_units_[v].length) {
      if (receive_units_[v].mode == Mode::kHeader) {
        if (absl::Status h = op_.CheckHeader(in_header_, transport_.name(left)); !h.ok()) {
          return h;
        }
      }
      ++v;
      got = 0;
    }
    while (s < num_send && sent == send_units_[s].length) {
      ++s;
      sent = 0;
    }
    if (s == num_send && v == num_recv) break;
    if (transport_.aborted()) return absl::AbortedError("transport aborted");
    // 1. Receive straight into place.
    if (v < num_recv && recv_ready) {
      const ReceiveUnit& unit = receive_units_[v];
      int64_t requested;
      char* p = unit.vector->Piece(unit.begin + got, unit.length - got, &requested);
      const IoSlice slice{p, static_cast<size_t>(requested)};
      const IoResult r = in.TryReceive({&slice, 1});
      if (r.code == IoResult::kMoved) {
        got += r.bytes;
        total_received += r.bytes;
        recv_ready = r.bytes == requested;  // a short read drained the link
      } else if (r.code == IoResult::kWouldBlock) {
        recv_ready = false;
      } else {
        return op_.LinkFailed(r, "from", transport_.name(left), progress_text());
      }
    }

    // 2. Send: everything currently allowed, gathered into one call.
    if (s < num_send && allowed(s) > sent && send_ready) {
      int count = 0;
      int64_t requested = 0;
      int u = s;
      int64_t offset = sent;
      while (u < num_send && count < kMaxIoSlices) {
        const int64_t limit = allowed(u);
        if (offset < limit) {
          int64_t length = 0;
          char* p = send_units_[u].vector->Piece(send_units_[u].begin + offset, limit - offset,
                                                 &length);
          slices[count++] = IoSlice{p, static_cast<size_t>(length)};
          offset += length;
          requested += length;
        }
        if (offset == send_units_[u].length) {
          ++u;
          offset = 0;
        } else if (offset == limit) {
          break;
        }
      }
      const IoResult r = out.TrySend({slices, static_cast<size_t>(count)});
      if (r.code == IoResult::kMoved) {
        total_sent += r.bytes;
        send_ready = r.bytes == requested;  // a short write filled the link
        int64_t left_over = r.bytes;
        while (left_over > 0) {
          const int64_t step = std::min(left_over, send_units_[s].length - sent);
          sent += step;
          left_over -= step;
          if (sent == send_units_[s].length) {
            ++s;
            sent = 0;
          }
        }
      } else if (r.code == IoResult::kWouldBlock) {
        send_ready = false;
      } else {
        return op_.LinkFailed(r, "to", transport_.name(right), progress_text());
      }
    }
    // 3. Another pass after progress, or unless both directions would only
    // report kWouldBlock (a call that cannot progress costs as much as a
    // small transfer).
    const bool can_send_more = s < num_send && allowed(s) > sent && send_ready;
    if (total_sent + total_received != moved || (v < num_recv && recv_ready) || can_send_more) {
      moved = total_sent + total_received;
      continue;
    }

    const bool want_receive = v < num_recv;
    const bool want_send = s < num_send && allowed(s) > sent;
    const absl::Status w =
        transport_.WaitFor(want_receive ? &in : nullptr, want_send ? &out : nullptr, deadline,
                           &recv_ready, &send_ready);
    if (absl::IsDeadlineExceeded(w)) {
      return op_.RingTimedOut(transport_, want_receive, progress_text());
    }
    if (!w.ok()) return op_.WaitFailed(w);
  }
  return absl::OkStatus();
}

}  // namespace distrain
