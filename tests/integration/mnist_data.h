#ifndef DISTRAIN_TESTS_INTEGRATION_MNIST_DATA_H_
#define DISTRAIN_TESTS_INTEGRATION_MNIST_DATA_H_

// The real MNIST digits the scripts write (idempotent and cached; the test
// command runs them before the tests, so here they only print the path):
// scripts/mnist.sh's IDX files (DISTRAIN_MNIST_DIR overrides it) and
// scripts/mnist_tfrecord.sh's TFRecord shards, written by TensorFlow.

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "tests/integration/subprocess.h"

namespace distrain::testing {

// The last line a data script prints: the directory it wrote.
inline std::string DataScriptDir(const std::string& script) {
  Subprocess run({"/bin/bash", SourceDir() + "/scripts/" + script});
  auto rc = run.Wait(600);
  EXPECT_TRUE(rc.has_value() && *rc == 0) << run.output();
  std::string out = run.output();
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out.substr(out.rfind('\n') + 1);
}

inline const std::string& MnistDir() {
  static const std::string* dir = [] {
    if (const char* env = std::getenv("DISTRAIN_MNIST_DIR"); env != nullptr && *env != '\0') {
      return new std::string(env);
    }
    return new std::string(DataScriptDir("mnist.sh"));
  }();
  return *dir;
}

// Needs the TensorFlow venv (tensorflow_peer.h): check that first.
inline const std::string& MnistTfRecordDir() {
  static const std::string* dir = new std::string(DataScriptDir("mnist_tfrecord.sh"));
  return *dir;
}

}  // namespace distrain::testing

#endif  // DISTRAIN_TESTS_INTEGRATION_MNIST_DATA_H_
