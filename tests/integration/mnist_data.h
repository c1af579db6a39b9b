#ifndef DISTRAIN_TESTS_INTEGRATION_MNIST_DATA_H_
#define DISTRAIN_TESTS_INTEGRATION_MNIST_DATA_H_

// The real MNIST IDX files scripts/mnist.sh writes (idempotent and cached; the
// test command runs it before the tests, so here it only prints the path).
// DISTRAIN_MNIST_DIR overrides it.

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "tests/integration/subprocess.h"

namespace distrain::testing {

inline const std::string& MnistDir() {
  static const std::string* dir = [] {
    if (const char* env = std::getenv("DISTRAIN_MNIST_DIR"); env != nullptr && *env != '\0') {
      return new std::string(env);
    }
    Subprocess script({"/bin/bash", SourceDir() + "/scripts/mnist.sh"});
    auto rc = script.Wait(600);
    EXPECT_TRUE(rc.has_value() && *rc == 0) << script.output();
    std::string out = script.output();
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return new std::string(out.substr(out.rfind('\n') + 1));
  }();
  return *dir;
}

}  // namespace distrain::testing

#endif  // DISTRAIN_TESTS_INTEGRATION_MNIST_DATA_H_
