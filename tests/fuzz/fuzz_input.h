#ifndef DISTRAIN_TESTS_FUZZ_FUZZ_INPUT_H_
#define DISTRAIN_TESTS_FUZZ_FUZZ_INPUT_H_

// The layout of the inputs of the fuzz targets that drive a sequence of
// messages (ps, ps worker, coordination, TFRecord dataset): an operation
// byte, then messages, each a 2-byte little-endian length and that many bytes
// (the last one may be shorter: it gets what is left). A plain layout rather
// than FuzzedDataProvider's (which reads integers from the end) so that
// make_seeds.cc can write real messages as seeds and a crashing input can be
// read with a hex dump. Header-only; not thread-safe.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace distrain::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size)
      : rest_(reinterpret_cast<const char*>(data), size) {}

  bool empty() const { return rest_.empty(); }
  // The next byte; 0 once the input is used up.
  uint8_t Byte() {
    if (rest_.empty()) return 0;
    const uint8_t b = static_cast<uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return b;
  }
  // The next message (see the file comment).
  std::string_view Message() {
    const size_t length = Byte() | (size_t{Byte()} << 8);
    const std::string_view m = rest_.substr(0, length);
    rest_.remove_prefix(m.size());
    return m;
  }
  std::string_view Rest() const { return rest_; }

 private:
  std::string_view rest_;
};

// The inverse of FuzzInput::Message, for seeds.
inline std::string EncodeMessage(std::string_view message) {
  std::string out;
  out.push_back(static_cast<char>(message.size() & 0xff));
  out.push_back(static_cast<char>((message.size() >> 8) & 0xff));
  out.append(message.substr(0, 0xffff));
  return out;
}

}  // namespace distrain::fuzz

#endif  // DISTRAIN_TESTS_FUZZ_FUZZ_INPUT_H_
