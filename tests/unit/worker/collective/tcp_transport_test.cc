// The TCP transport on its own (worker/collective/tcp_transport.h): what the
// algorithms rely on from it, over loopback with ranks as threads.

#include "worker/collective/tcp_transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/unit/worker/collective/collective_test_util.h"
#include "worker/collective/operation.h"

namespace distrain {
namespace {

using collective_testing::OnEveryRank;
using Group = std::vector<std::unique_ptr<TcpTransport>>;

Group Connect(int n, bool mesh, int socket_buffer_bytes = 0) {
  InMemoryStore store;
  TcpTransportOptions options;
  options.key_prefix = "transport-test";
  options.setup_timeout = absl::Seconds(20);
  options.mesh = mesh;
  options.socket_buffer_bytes = socket_buffer_bytes;
  for (int r = 0; r < n; ++r) options.names.push_back(absl::StrCat("worker:", r));
  Group group(n);
  std::vector<absl::Status> status(n);
  OnEveryRank(n, [&](int r) {
    auto created = TcpTransport::Create(store, r, n, options);
    if (created.ok()) {
      group[r] = *std::move(created);
    } else {
      status[r] = created.status();
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  return group;
}

// Moves all of `bytes` over `link` with the non-blocking calls and Wait, as
// the algorithms do.
absl::Status SendAll(Transport& transport, Link& link, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const IoSlice slice{const_cast<char*>(bytes.data()) + sent, bytes.size() - sent};
    const IoResult r = link.TrySend({&slice, 1});
    if (r.code == IoResult::kMoved) {
      sent += static_cast<size_t>(r.bytes);
      continue;
    }
    if (r.code != IoResult::kWouldBlock) return absl::UnavailableError(r.reason);
    LinkWait wait{&link, LinkWait::kSend};
    if (absl::Status s = transport.Wait({&wait, 1}, absl::Now() + absl::Seconds(20)); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// Receives `size` bytes in reads of at most `piece` bytes, each split over
// two slices; the last IoResult goes to *last.
std::string ReceiveAll(Transport& transport, Link& link, size_t size, size_t piece,
                       IoResult* last) {
  std::string got(size, '\0');
  size_t at = 0;
  while (at < size) {
    const size_t want = std::min(piece, size - at);
    const IoSlice slices[2] = {{got.data() + at, want / 2},
                               {got.data() + at + want / 2, want - want / 2}};
    *last = link.TryReceive({slices, 2});
    if (last->code == IoResult::kMoved) {
      at += static_cast<size_t>(last->bytes);
      continue;
    }
    if (last->code != IoResult::kWouldBlock) break;
    LinkWait wait{&link, LinkWait::kReceive};
    if (!transport.Wait({&wait, 1}, absl::Now() + absl::Seconds(20)).ok()) break;
  }
  got.resize(at);
  return got;
}

std::string Pattern(size_t size, int seed) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i) s[i] = static_cast<char>((i * 131 + seed * 7 + i / 251) & 0xff);
  return s;
}

// Sends `out` to `peer` while receiving `in_size` bytes from it in reads of
// at most `piece` bytes (each split over two slices), on one thread as an
// algorithm does: both directions in turn, waiting only when neither moves.
absl::Status SendWhileReceiving(Transport& transport, int peer, const std::string& out,
                                size_t in_size, size_t piece, std::string* in) {
  Link& send = *transport.SendLink(peer);
  Link& receive = *transport.ReceiveLink(peer);
  in->assign(in_size, '\0');
  size_t sent = 0, got = 0;
  while (sent < out.size() || got < in_size) {
    bool moved = false;
    if (sent < out.size()) {
      const IoSlice slice{const_cast<char*>(out.data()) + sent, out.size() - sent};
      const IoResult r = send.TrySend({&slice, 1});
      if (r.code == IoResult::kMoved) {
        sent += static_cast<size_t>(r.bytes);
        moved = true;
      } else if (r.code != IoResult::kWouldBlock) {
        return absl::UnavailableError(absl::StrCat("send: ", r.reason));
      }
    }
    if (got < in_size) {
      const size_t want = std::min(piece, in_size - got);
      const IoSlice slices[2] = {{in->data() + got, want / 2},
                                 {in->data() + got + want / 2, want - want / 2}};
      const IoResult r = receive.TryReceive({slices, 2});
      if (r.code == IoResult::kMoved) {
        got += static_cast<size_t>(r.bytes);
        moved = true;
      } else if (r.code != IoResult::kWouldBlock) {
        return absl::UnavailableError(absl::StrCat("receive: code ", r.code));
      }
    }
    if (moved) continue;
    LinkWait waits[2] = {{&send, LinkWait::kSend}, {&receive, LinkWait::kReceive}};
    const size_t first = sent < out.size() ? 0 : 1;
    const size_t last = got < in_size ? 2 : 1;
    if (absl::Status s = transport.Wait({waits + first, last - first},
                                        absl::Now() + absl::Seconds(20));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

TEST(TcpTransportTest, APairMovesBytesInOrderBothWaysAtOnce) {
  Group group = Connect(2, /*mesh=*/true, /*socket_buffer_bytes=*/64 << 10);
  ASSERT_FALSE(HasFailure());
  // Far more than the socket buffers hold, so neither side finishes sending
  // unless the other receives meanwhile.
  constexpr size_t kBytes = 3 << 20;
  const std::string out[2] = {Pattern(kBytes, 0), Pattern(kBytes, 1)};
  std::string in[2];
  absl::Status status[2];
  OnEveryRank(2, [&](int r) {
    status[r] = SendWhileReceiving(*group[r], 1 - r, out[r], kBytes, r == 0 ? 4099 : 100003,
                                   &in[r]);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(status[r].ok()) << "worker:" << r << ": " << status[r];
    EXPECT_TRUE(in[r] == out[1 - r]) << "worker:" << r << " received bytes out of order";
    // Link bytes count, the handshake does not.
    EXPECT_EQ(group[r]->stats().bytes_sent, static_cast<int64_t>(kBytes));
    EXPECT_EQ(group[r]->stats().bytes_received, static_cast<int64_t>(kBytes));
  }
}

TEST(TcpTransportTest, APeersCloseIsReportedAndWordedNamingThePeer) {
  Group group = Connect(2, /*mesh=*/false);
  ASSERT_FALSE(HasFailure());
  const std::string last_words = Pattern(1000, 3);
  ASSERT_TRUE(SendAll(*group[1], *group[1]->SendLink(0), last_words).ok());
  group[1].reset();  // worker:1's process is gone
  // What it sent before going arrives first, then the close.
  IoResult last;
  const std::string got = ReceiveAll(*group[0], *group[0]->ReceiveLink(1), 2000, 512, &last);
  EXPECT_EQ(got, last_words);
  ASSERT_EQ(last.code, IoResult::kClosed);
  // The algorithms word it with the peer's name, which carries its address.
  Operation op;
  const std::string tag = "grads";
  op.Begin(OpKind::kAllReduce, ReduceOp::kSum, 0, 8000);
  op.Name("all-reduce", &tag);
  const absl::Status status =
      op.LinkFailed(last, "from", group[0]->name(1), "received 1000 of 8024 bytes");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("all-reduce 'grads' #1: worker:1 (127.0.0.1:"),
            std::string::npos)
      << status;
  EXPECT_NE(status.message().find("closed the connection"), std::string::npos) << status;
}

TEST(TcpTransportTest, WaitEndsAtItsDeadlineAndAtAbort) {
  Group group = Connect(2, /*mesh=*/false);
  ASSERT_FALSE(HasFailure());
  LinkWait wait{group[0]->ReceiveLink(1), LinkWait::kReceive};
  absl::Time start = absl::Now();
  absl::Status s = group[0]->Wait({&wait, 1}, start + absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_FALSE(wait.ready);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));

  // A blocking receive ends at its deadline too.
  char byte;
  const IoSlice slice{&byte, 1};
  IoResult r{IoResult::kWouldBlock};
  start = absl::Now();
  while (r.code == IoResult::kWouldBlock) {
    r = group[0]->ReceiveLink(1)->Receive({&slice, 1}, start + absl::Milliseconds(100));
  }
  EXPECT_EQ(r.code, IoResult::kTimedOut);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));

  // Abort from another thread wakes a wait with a far deadline, and the
  // peer sees its links close.
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    group[0]->Abort();
  });
  start = absl::Now();
  s = group[0]->Wait({&wait, 1}, start + absl::Seconds(20));
  aborter.join();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(group[0]->aborted());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  IoResult peer;
  ReceiveAll(*group[1], *group[1]->ReceiveLink(0), 1, 1, &peer);
  EXPECT_EQ(peer.code, IoResult::kClosed);
}

TEST(TcpTransportTest, OnlyTheMeshConnectsNonNeighbours) {
  for (bool mesh : {false, true}) {
    Group group = Connect(4, mesh);
    ASSERT_FALSE(HasFailure());
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(group[r]->fully_connected(), mesh);
      for (int p = 0; p < 4; ++p) {
        if (p == r) continue;
        const bool neighbour = p == (r + 1) % 4 || p == (r + 3) % 4;
        EXPECT_EQ(group[r]->SendLink(p) != nullptr, neighbour || mesh) << r << " -> " << p;
        // One connection per pair of ranks beyond two: both directions share it.
        EXPECT_EQ(group[r]->SendLink(p), group[r]->ReceiveLink(p)) << r << " <-> " << p;
      }
    }
    // Messages pass over a mesh link too.
    if (mesh) {
      const std::string hello = Pattern(777, 9);
      ASSERT_TRUE(SendAll(*group[0], *group[0]->SendLink(2), hello).ok());
      IoResult last;
      EXPECT_EQ(ReceiveAll(*group[2], *group[2]->ReceiveLink(0), 777, 1000, &last), hello);
    }
  }
}

}  // namespace
}  // namespace distrain
