#ifndef DISTRAIN_COMMON_CHECK_H_
#define DISTRAIN_COMMON_CHECK_H_

// Invariant checks (docs/architecture.md §9: expected failures return absl::Status;
// broken invariants abort). Debian 12's abseil predates absl/log, so these
// are ours: on failure they print file:line and the message, then abort.
//
//   DISTRAIN_CHECK(n > 0) << "n=" << n;
//   DISTRAIN_CHECK_EQ(a.size(), b.size());

#include <cstdlib>
#include <iostream>
#include <sstream>

namespace distrain::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": check failed: " << condition << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::cerr << stream_.str() << std::endl;
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `cond ? (void)0 : Voidify() & CheckFailure(...).stream() << ...` type-check.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace distrain::internal

#define DISTRAIN_CHECK(condition)                  \
  (condition) ? (void)0                            \
              : ::distrain::internal::Voidify() &  \
                    ::distrain::internal::CheckFailure(__FILE__, __LINE__, #condition).stream()

#define DISTRAIN_CHECK_OP_(a, b, op) DISTRAIN_CHECK((a)op(b)) << "(" << (a) << " vs " << (b) << ") "
#define DISTRAIN_CHECK_EQ(a, b) DISTRAIN_CHECK_OP_(a, b, ==)
#define DISTRAIN_CHECK_NE(a, b) DISTRAIN_CHECK_OP_(a, b, !=)
#define DISTRAIN_CHECK_LT(a, b) DISTRAIN_CHECK_OP_(a, b, <)
#define DISTRAIN_CHECK_LE(a, b) DISTRAIN_CHECK_OP_(a, b, <=)
#define DISTRAIN_CHECK_GT(a, b) DISTRAIN_CHECK_OP_(a, b, >)
#define DISTRAIN_CHECK_GE(a, b) DISTRAIN_CHECK_OP_(a, b, >=)

#endif  // DISTRAIN_COMMON_CHECK_H_
