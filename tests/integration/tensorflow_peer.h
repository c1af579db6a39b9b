#ifndef DISTRAIN_TESTS_INTEGRATION_TENSORFLOW_PEER_H_
#define DISTRAIN_TESTS_INTEGRATION_TENSORFLOW_PEER_H_

// The Python with tensorflow-cpu, keras and tensorboard that scripts/setup.sh
// installs (~/.cache/distrain/peers-venv), for tests whose other side is
// TensorFlow itself: exported .keras files, TFRecord files tf.io writes, event
// files TensorBoard reads. Tests skip (GTEST_SKIP) when it is absent, which
// happens only after `setup.sh --no-peers`; CI always has it.

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace distrain::testing_peer {

inline std::string TensorFlowPython() {
  if (const char* python = std::getenv("DISTRAIN_TF_PYTHON"); python != nullptr && *python) {
    return python;
  }
  std::string cache;
  if (const char* c = std::getenv("DISTRAIN_CACHE"); c != nullptr && *c) {
    cache = c;
  } else if (const char* home = std::getenv("HOME"); home != nullptr) {
    cache = std::string(home) + "/.cache/distrain";
  }
  const std::string python = cache + "/peers-venv/bin/python";
  return ::access(python.c_str(), X_OK) == 0 ? python : std::string();
}

}  // namespace distrain::testing_peer

#define DISTRAIN_REQUIRE_TENSORFLOW(python_var)                                          \
  const std::string python_var = ::distrain::testing_peer::TensorFlowPython();           \
  if (python_var.empty()) {                                                              \
    GTEST_SKIP() << "TensorFlow peer venv missing: run scripts/setup.sh (without --no-peers)"; \
  }

#endif  // DISTRAIN_TESTS_INTEGRATION_TENSORFLOW_PEER_H_
