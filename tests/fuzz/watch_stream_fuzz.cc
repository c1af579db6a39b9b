// Fuzz target: the operator's watch-stream parser (operator/kube/rest_client.h
// WatchStreamParser): the newline-delimited JSON events of a `?watch=true`
// response, however the bytes are chunked. The first input byte sets the
// chunk sizes the stream is fed in (0: all at once); the event callback
// stops the stream after 64 events, as an informer's stop would. Corpus:
// tests/fuzz/corpus/watch_stream/ (watch lines a real kube-apiserver sent
// for jobs, pods and bookmarks, and an ERROR event).

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "operator/kube/rest_client.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const unsigned cut = data[0];
  const std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  distrain::kube::WatchStreamParser parser;
  int seen = 0;
  const auto on_event = [&seen](const distrain::kube::WatchEvent& event) {
    (void)event.type.size();
    return ++seen < 64;
  };
  for (size_t at = 0, i = 0; at < stream.size(); ++i) {
    const size_t n = cut == 0 ? stream.size() : 1 + (cut * 31 + i * 17) % 97;
    if (!parser.Feed(stream.substr(at, n), on_event).ok()) return 0;
    if (parser.stopped()) return 0;
    at += n;
  }
  (void)parser.Finish(on_event);
  return 0;
}
