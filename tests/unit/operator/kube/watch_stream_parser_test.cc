#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/rest_client.h"

namespace distrain::kube {
namespace {

using ::testing::HasSubstr;

// Three events as the API server frames them: one JSON object per line. The
// second one's object holds a newline inside a string (escaped, as JSON must)
// and multi-byte UTF-8, so a split may land inside a character.
const std::string kStream =
    R"({"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"10"}}})"
    "\n"
    R"({"type":"MODIFIED","object":{"metadata":{"name":"b","resourceVersion":"11"},"data":{"k":"line1\nzürich ✓"}}})"
    "\n"
    R"({"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"12"}}})"
    "\n";

std::vector<std::string> Summaries(const std::vector<WatchEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) {
    out.push_back(e.type + "@" + e.object["metadata"]["resourceVersion"].get<std::string>());
  }
  return out;
}

TEST(WatchStreamParserTest, SameEventsWhateverTheChunking) {
  const std::vector<std::string> expected = {"ADDED@10", "MODIFIED@11", "BOOKMARK@12"};
  // Every chunk size, and every two-way split point.
  for (size_t chunk = 1; chunk <= kStream.size(); ++chunk) {
    WatchStreamParser parser;
    std::vector<WatchEvent> events;
    auto collect = [&](const WatchEvent& e) {
      events.push_back(e);
      return true;
    };
    for (size_t i = 0; i < kStream.size(); i += chunk) {
      ASSERT_TRUE(parser.Feed(std::string_view(kStream).substr(i, chunk), collect).ok());
    }
    ASSERT_TRUE(parser.Finish(collect).ok());
    ASSERT_EQ(Summaries(events), expected) << "chunk size " << chunk;
    EXPECT_EQ(events[1].object["data"]["k"], "line1\nzürich ✓");
  }
  for (size_t split = 0; split <= kStream.size(); ++split) {
    WatchStreamParser parser;
    std::vector<WatchEvent> events;
    auto collect = [&](const WatchEvent& e) {
      events.push_back(e);
      return true;
    };
    ASSERT_TRUE(parser.Feed(std::string_view(kStream).substr(0, split), collect).ok());
    ASSERT_TRUE(parser.Feed(std::string_view(kStream).substr(split), collect).ok());
    ASSERT_EQ(Summaries(events), expected) << "split at " << split;
  }
}

TEST(WatchStreamParserTest, EventIsDeliveredOnlyOnceItsLineIsComplete) {
  WatchStreamParser parser;
  int count = 0;
  auto collect = [&](const WatchEvent&) {
    ++count;
    return true;
  };
  std::string first = kStream.substr(0, kStream.find('\n'));
  ASSERT_TRUE(parser.Feed(first, collect).ok());
  EXPECT_EQ(count, 0);
  ASSERT_TRUE(parser.Feed("\n", collect).ok());
  EXPECT_EQ(count, 1);
}

TEST(WatchStreamParserTest, BlankLinesAreIgnored) {
  WatchStreamParser parser;
  std::vector<WatchEvent> events;
  auto collect = [&](const WatchEvent& e) {
    events.push_back(e);
    return true;
  };
  ASSERT_TRUE(parser.Feed("\n\r\n  \n" + kStream + "\n\n", collect).ok());
  EXPECT_EQ(events.size(), 3u);
}

TEST(WatchStreamParserTest, MalformedLineNamesItsByteOffset) {
  WatchStreamParser parser;
  std::string first = kStream.substr(0, kStream.find('\n') + 1);
  auto ignore = [](const WatchEvent&) { return true; };
  ASSERT_TRUE(parser.Feed(first, ignore).ok());
  absl::Status st = parser.Feed("{\"type\": \"ADDED\", \"obj\n", ignore);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("byte offset " + std::to_string(first.size())));
}

TEST(WatchStreamParserTest, LineWithoutTypeIsRejected) {
  WatchStreamParser parser;
  absl::Status st = parser.Feed("{\"object\": {}}\n", [](const WatchEvent&) { return true; });
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
}

TEST(WatchStreamParserTest, TruncatedLastLineIsAnErrorButACompleteOneIsDelivered) {
  auto ignore = [](const WatchEvent&) { return true; };
  WatchStreamParser truncated;
  ASSERT_TRUE(truncated.Feed(kStream.substr(0, 20), ignore).ok());
  EXPECT_EQ(truncated.Finish(ignore).code(), absl::StatusCode::kDataLoss);

  WatchStreamParser unterminated;
  int count = 0;
  auto collect = [&](const WatchEvent&) {
    ++count;
    return true;
  };
  ASSERT_TRUE(unterminated.Feed(kStream.substr(0, kStream.find('\n')), collect).ok());
  ASSERT_TRUE(unterminated.Finish(collect).ok());
  EXPECT_EQ(count, 1);
}

TEST(WatchStreamParserTest, StopsWhenTheHandlerSaysSo) {
  WatchStreamParser parser;
  int count = 0;
  ASSERT_TRUE(parser
                  .Feed(kStream,
                        [&](const WatchEvent&) {
                          ++count;
                          return false;
                        })
                  .ok());
  EXPECT_TRUE(parser.stopped());
  EXPECT_EQ(count, 1);
}

}  // namespace
}  // namespace distrain::kube
