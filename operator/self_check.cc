#include "operator/self_check.h"

#include <cpprest/http_client.h>

#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "operator/kube/kubeconfig.h"
#include "operator/kube/rest_client.h"

namespace distrain {
namespace {

using Json = nlohmann::json;

struct HttpAnswer {
  int status = 0;
  std::string body;
};

absl::StatusOr<HttpAnswer> HttpGet(const std::string& url, absl::Duration timeout) {
  try {
    web::http::client::http_client_config config;
    config.set_timeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
    web::http::client::http_client http(utility::conversions::to_string_t(url), config);
    web::http::http_response response = http.request(web::http::methods::GET).get();
    return HttpAnswer{response.status_code(), response.extract_utf8string(true).get()};
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("GET ", url, ": ", e.what()));
  }
}

// Retries `attempt` once a second until it succeeds or `wait` has passed; the
// last error is the answer.
absl::Status Retry(absl::Duration wait, const std::function<absl::Status()>& attempt) {
  const absl::Time deadline = absl::Now() + wait;
  while (true) {
    absl::Status s = attempt();
    if (s.ok() || absl::Now() >= deadline) return s;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

}  // namespace

absl::Status CheckLeaderMetrics(const std::string& exposition) {
  std::istringstream in(exposition);
  std::string line;
  bool seen = false;
  while (std::getline(in, line)) {
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&l, "leader_election_master_status")) continue;
    if (l.empty() || (l.front() != '{' && l.front() != ' ')) continue;  // another metric sharing the prefix
    if (l.front() == '{') {
      const size_t close = l.find('}');
      if (close == absl::string_view::npos) continue;
      l.remove_prefix(close + 1);
    }
    l = absl::StripLeadingAsciiWhitespace(l);
    const absl::string_view value = l.substr(0, l.find(' '));  // a timestamp may follow
    double v = 0;
    if (!absl::SimpleAtod(value, &v)) continue;
    seen = true;
    if (v == 1) return absl::OkStatus();
  }
  if (!seen) return absl::NotFoundError("no leader_election_master_status sample (is --leader-elect on?)");
  return absl::FailedPreconditionError("leader_election_master_status is 0: the replica behind the Service is not the leader");
}

absl::Status CheckCrdServed(const Json& resource_list, const std::string& plural) {
  for (const Json& r : resource_list.value("resources", Json::array())) {
    if (r.value("name", "") == plural) return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("discovery for ", resource_list.value("groupVersion", "?"), " does not list ",
                                          plural, " (is the CRD installed and Established?)"));
}

absl::Status RunSelfCheck(const SelfCheckOptions& options, const std::function<void(const std::string&)>& say) {
  if (!options.readyz_url.empty()) {
    absl::Status s = Retry(options.wait, [&]() -> absl::Status {
      auto r = HttpGet(options.readyz_url, options.request_timeout);
      if (!r.ok()) return r.status();
      if (r->status != 200) {
        return absl::UnavailableError(absl::StrCat("GET ", options.readyz_url, ": HTTP ", r->status, " ", r->body));
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    say(absl::StrCat("ok: ", options.readyz_url, " answers 200"));
  }
  if (!options.metrics_url.empty()) {
    absl::Status s = Retry(options.wait, [&]() -> absl::Status {
      auto r = HttpGet(options.metrics_url, options.request_timeout);
      if (!r.ok()) return r.status();
      if (r->status != 200) return absl::UnavailableError(absl::StrCat("GET ", options.metrics_url, ": HTTP ", r->status));
      absl::Status leader = CheckLeaderMetrics(r->body);
      if (!options.require_leader && absl::IsNotFound(leader)) return absl::OkStatus();
      if (!leader.ok()) return absl::Status(leader.code(), absl::StrCat(options.metrics_url, ": ", leader.message()));
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    say(absl::StrCat("ok: ", options.metrics_url, options.require_leader ? " reports leader_election_master_status 1" : " answers"));
  }
  if (!options.crd.empty()) {
    // "plural.group/version"
    const size_t dot = options.crd.find('.'), slash = options.crd.rfind('/');
    if (dot == std::string::npos || slash == std::string::npos || slash < dot) {
      return absl::InvalidArgumentError(absl::StrCat("--crd: want plural.group/version such as "
                                                     "distributedtrainingjobs.distrain.io/v1alpha1, got ", options.crd));
    }
    const std::string plural = options.crd.substr(0, dot);
    const std::string group_version = options.crd.substr(dot + 1);
    // context "": the kubeconfig's current-context (named: GCC 12 warns about
    // an omitted member that has no default initialiser).
    auto config = kube::LoadRestConfig({.kubeconfig_path = options.kubeconfig, .context = ""});
    if (!config.ok()) return config.status();
    auto client = kube::RestClient::Create(*config, {});
    if (!client.ok()) return client.status();
    absl::Status s = Retry(options.wait, [&]() -> absl::Status {
      auto r = (*client)->Request("GET", absl::StrCat("/apis/", group_version));
      if (!r.ok()) return r.status();
      if (!r->ok()) return absl::UnavailableError(absl::StrCat("GET /apis/", group_version, ": ", r->message()));
      return CheckCrdServed(r->body, plural);
    });
    if (!s.ok()) return s;
    say(absl::StrCat("ok: the API server serves ", plural, " in ", group_version, " (asked as ", config->source, ")"));
  }
  return absl::OkStatus();
}

}  // namespace distrain
