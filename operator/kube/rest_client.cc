#include "operator/kube/rest_client.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <random>
#include <sstream>
#include <system_error>
#include <thread>
#include <vector>

#include <boost/asio/ssl.hpp>
// cpprestsdk's U() macro would break fmt's templates; on Linux string_t is std::string.
#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/http_client.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"

namespace distrain::kube {
namespace {

using web::http::http_request;
using web::http::http_response;
using web::http::client::http_client;
using web::http::client::http_client_config;

constexpr char kErrorCode[] = "<error>";

bool IsIdempotent(std::string_view method) {
  return method == "GET" || method == "PUT" || method == "DELETE" || method == "HEAD";
}

// The TLS credentials, parsed once: cpprestsdk builds a new ssl::context for
// every connection it opens, and parsing the PEMs there (OpenSSL's decoders)
// was a visible share of the operator's CPU during a burst of creations.
// Installing parsed objects only takes references. Immutable after Load;
// shared by all connections' callbacks.
class TlsCredentials {
 public:
  // Throws std::runtime_error naming what did not parse.
  static std::shared_ptr<const TlsCredentials> Load(const std::string& ca_pem,
                                                    const std::string& cert_pem,
                                                    const std::string& key_pem) {
    auto creds = std::shared_ptr<TlsCredentials>(new TlsCredentials());
    if (!ca_pem.empty()) {
      BioPtr bio = MemBio(ca_pem);
      while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
        creds->cas_.push_back(X509Ptr(cert));
      }
      ERR_clear_error();  // the end of the bundle reads as an error
      if (creds->cas_.empty()) throw std::runtime_error("no certificate in the CA bundle");
    }
    if (!cert_pem.empty()) {
      BioPtr bio = MemBio(cert_pem);
      X509* leaf = PEM_read_bio_X509_AUX(bio.get(), nullptr, nullptr, nullptr);
      if (leaf == nullptr) throw std::runtime_error("the client certificate is not PEM");
      creds->cert_.reset(leaf);
      while (X509* extra = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
        creds->chain_.push_back(X509Ptr(extra));
      }
      ERR_clear_error();
      BioPtr key_bio = MemBio(key_pem);
      EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
      if (key == nullptr) throw std::runtime_error("the client key is not PEM");
      creds->key_.reset(key);
    }
    // Fail now, not at the first handshake, on a key that is not the cert's.
    boost::asio::ssl::context probe(boost::asio::ssl::context::sslv23);
    creds->Install(probe);
    return creds;
  }

  // Installs the CA bundle (replacing the system store: only the cluster's CA
  // is trusted, as kubectl does) and the client certificate into `ctx`.
  // Throws boost::system::system_error when OpenSSL refuses them.
  void Install(boost::asio::ssl::context& ctx) const {
    ctx.set_options(boost::asio::ssl::context::default_workarounds |
                    boost::asio::ssl::context::no_sslv2 | boost::asio::ssl::context::no_sslv3 |
                    boost::asio::ssl::context::no_tlsv1 | boost::asio::ssl::context::no_tlsv1_1);
    SSL_CTX* native = ctx.native_handle();
    if (!cas_.empty()) {
      X509_STORE* store = X509_STORE_new();
      for (const X509Ptr& ca : cas_) X509_STORE_add_cert(store, ca.get());  // takes a reference
      SSL_CTX_set_cert_store(native, store);
    }
    if (cert_ != nullptr) {
      Check(SSL_CTX_use_certificate(native, cert_.get()), "use the client certificate");
      for (const X509Ptr& extra : chain_) {
        Check(SSL_CTX_add1_chain_cert(native, extra.get()), "add the client certificate chain");
      }
      Check(SSL_CTX_use_PrivateKey(native, key_.get()), "use the client key");
      Check(SSL_CTX_check_private_key(native), "match the client key to its certificate");
    }
  }

 private:
  struct X509Free {
    void operator()(X509* x) const { X509_free(x); }
  };
  struct KeyFree {
    void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
  };
  struct BioFree {
    void operator()(BIO* b) const { BIO_free(b); }
  };
  using X509Ptr = std::unique_ptr<X509, X509Free>;
  using BioPtr = std::unique_ptr<BIO, BioFree>;

  TlsCredentials() = default;

  static BioPtr MemBio(const std::string& pem) {
    return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  }
  static void Check(int ok, const char* what) {
    if (ok == 1) return;
    const unsigned long err = ERR_get_error();
    throw boost::system::system_error(
        boost::system::error_code(static_cast<int>(err), boost::asio::error::get_ssl_category()),
        absl::StrCat("cannot ", what));
  }

  std::vector<X509Ptr> cas_;
  X509Ptr cert_;
  std::vector<X509Ptr> chain_;
  std::unique_ptr<EVP_PKEY, KeyFree> key_;
};

// "timeoutSeconds=N" in a query, if any.
std::optional<int64_t> TimeoutSecondsOf(std::string_view path_and_query) {
  constexpr std::string_view kKey = "timeoutSeconds=";
  auto query = path_and_query.find('?');
  if (query == std::string_view::npos) return std::nullopt;
  size_t pos = query;
  while ((pos = path_and_query.find(kKey, pos)) != std::string_view::npos) {
    char before = path_and_query[pos - 1];
    if (before == '?' || before == '&') {
      int64_t value = 0;
      const char* begin = path_and_query.data() + pos + kKey.size();
      const char* end = path_and_query.data() + path_and_query.size();
      auto [ptr, ec] = std::from_chars(begin, end, value);
      if (ec == std::errc() && ptr != begin) return value;
      return std::nullopt;
    }
    pos += kKey.size();
  }
  return std::nullopt;
}

nlohmann::json ParseBody(const std::string& text) {
  if (text.empty()) return nullptr;
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return text;  // e.g. "404 page not found" from a non-API path
  return parsed;
}

// A metav1.Status for a non-2xx answer whose body is not one.
nlohmann::json AsStatus(int code, const nlohmann::json& body) {
  if (body.is_object() && body.value("kind", "") == "Status") return body;
  std::string message = body.is_string() ? body.get<std::string>() : body.dump();
  return {{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Failure"},
          {"code", code},     {"message", message}};
}

// Reads a bearer token file, trimmed.
absl::StatusOr<std::string> ReadToken(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read token file ", path));
  std::ostringstream text;
  text << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(text.str()));
  if (token.empty()) return absl::UnavailableError(absl::StrCat("token file ", path, " is empty"));
  return token;
}

}  // namespace

struct RestClient::Impl {
  RestConfig config;
  RestClientOptions options;
  web::uri base_uri;
  http_client_config http_config;
  std::unique_ptr<http_client> client;  // Request(); thread-safe, pools connections
  std::unique_ptr<TokenBucketRateLimiter> limiter;
  const Clock* clock = nullptr;

  absl::Mutex token_mu;
  std::string token ABSL_GUARDED_BY(token_mu);
  absl::Time token_read_at ABSL_GUARDED_BY(token_mu);

  prometheus::Family<prometheus::Counter>* requests = nullptr;
  prometheus::Family<prometheus::Histogram>* latency = nullptr;

  // One HTTP exchange, no retries.
  struct Attempt {
    bool transport_error = false;
    bool maybe_sent = false;   // the server may have seen the request
    bool timed_out = false;
    std::string error;         // transport error text
    int status = 0;
    std::string body;
    std::optional<std::chrono::seconds> retry_after;
  };

  std::string Token() {
    absl::MutexLock lock(&token_mu);
    if (!config.bearer_token_file.empty()) {
      auto now = clock->Now();
      if (token.empty() || now - token_read_at >= absl::FromChrono(options.token_refresh_interval)) {
        auto fresh = ReadToken(config.bearer_token_file);
        if (fresh.ok()) {
          token = std::move(*fresh);
        } else if (!token.empty()) {
          spdlog::warn("kube client: keeping the last token: {}", fresh.status().message());
        }
        token_read_at = now;
      }
    }
    return token;
  }

  http_request MakeRequest(std::string_view method, std::string_view path_and_query) {
    http_request req(utility::conversions::to_string_t(std::string(method)));
    req.set_request_uri(web::uri(utility::conversions::to_string_t(std::string(path_and_query))));
    req.headers().add("Accept", "application/json");
    req.headers().add("User-Agent", utility::conversions::to_string_t(options.user_agent));
    if (std::string t = Token(); !t.empty()) {
      req.headers().add("Authorization", utility::conversions::to_string_t("Bearer " + t));
    }
    return req;
  }

  void Record(std::string_view method, std::string_view verb, const std::string& code,
              std::chrono::steady_clock::duration elapsed) {
    if (requests == nullptr) return;
    requests->Add({{"code", code}, {"method", std::string(method)}}).Increment();
    latency
        ->Add({{"verb", std::string(verb)}},
              prometheus::Histogram::BucketBoundaries{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8,
                                                      15, 30, 60})
        .Observe(std::chrono::duration<double>(elapsed).count());
  }

  static void Classify(const std::exception& e, Attempt& out) {
    out.transport_error = true;
    out.error = e.what();
    out.maybe_sent = true;
    if (const auto* he = dynamic_cast<const web::http::http_exception*>(&e)) {
      const std::error_code code = he->error_code();
      if (code == std::errc::timed_out) out.timed_out = true;
      // cpprestsdk maps a refused connect to host_unreachable; resolve, connect
      // and TLS handshake failures all happen before the request is written.
      std::string what = absl::AsciiStrToLower(he->what());
      if (code == std::errc::host_unreachable || what.find("connect") != std::string::npos ||
          what.find("resolv") != std::string::npos || what.find("handshake") != std::string::npos) {
        out.maybe_sent = false;
      }
    }
  }

  Attempt Once(std::string_view method, std::string_view path_and_query,
               const std::string* body_text, std::string_view content_type) {
    Attempt out;
    try {
      http_request req = MakeRequest(method, path_and_query);
      if (body_text != nullptr) {
        req.set_body(*body_text, std::string(content_type));
      }
      http_response resp = client->request(req).get();
      out.status = resp.status_code();
      auto retry_after = resp.headers().find("Retry-After");
      if (retry_after != resp.headers().end()) {
        int64_t seconds = 0;
        std::string value = utility::conversions::to_utf8string(retry_after->second);
        auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
        if (ec == std::errc() && seconds >= 0) out.retry_after = std::chrono::seconds(seconds);
      }
      std::vector<unsigned char> bytes = resp.extract_vector().get();
      out.body.assign(bytes.begin(), bytes.end());
    } catch (const std::exception& e) {
      Classify(e, out);
    }
    return out;
  }

  std::chrono::nanoseconds Backoff(int attempt) {
    thread_local std::mt19937_64 rng(std::random_device{}());
    double base = std::chrono::duration<double>(options.initial_backoff).count() *
                  std::pow(2.0, std::min(attempt, 30));
    base = std::min(base, std::chrono::duration<double>(options.max_backoff).count());
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(base * jitter(rng)));
  }
};

absl::StatusOr<std::unique_ptr<RestClient>> RestClient::Create(const RestConfig& config,
                                                               RestClientOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->options = options;
  impl->clock = options.clock ? options.clock : Clock::Real();
  const std::string& where = config.source.empty() ? config.server : config.source;
  try {
    impl->base_uri = web::uri(utility::conversions::to_string_t(config.server));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": server URL \"", config.server, "\" is malformed: ", e.what()));
  }
  const bool https = impl->base_uri.scheme() == "https";
  if (!https && impl->base_uri.scheme() != "http") {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": server URL \"", config.server, "\" must be https:// or http://"));
  }
  if (!config.username.empty() && (!config.bearer_token.empty() || !config.bearer_token_file.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": both basic auth and a bearer token are set; keep one"));
  }
  if (https) {
    // Load the PEMs once here so a bad file is reported now, naming its source,
    // rather than as a failed TLS handshake on every request.
    std::shared_ptr<const TlsCredentials> credentials;
    try {
      credentials =
          TlsCredentials::Load(config.ca_pem, config.client_cert_pem, config.client_key_pem);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": cannot load the TLS credentials (certificate-authority, client-certificate, "
          "client-key): ", e.what()));
    }
    impl->http_config.set_validate_certificates(!config.insecure_skip_tls_verify);
    impl->http_config.set_ssl_context_callback(
        [credentials](boost::asio::ssl::context& ctx) { credentials->Install(ctx); });
  }
  if (!config.username.empty()) {
    impl->http_config.set_credentials(web::credentials(
        utility::conversions::to_string_t(config.username),
        utility::conversions::to_string_t(config.password)));
  }
  impl->http_config.set_timeout(options.timeout);
  impl->client = std::make_unique<http_client>(impl->base_uri, impl->http_config);
  impl->limiter = std::make_unique<TokenBucketRateLimiter>(options.qps, options.burst, impl->clock);
  {
    absl::MutexLock lock(&impl->token_mu);
    impl->token = config.bearer_token;
    impl->token_read_at = impl->clock->Now();
    if (!config.bearer_token_file.empty() && impl->token.empty()) {
      impl->token_read_at = absl::InfinitePast();  // read it on first use
    }
  }
  if (options.registry) {
    impl->requests = &prometheus::BuildCounter()
                          .Name("rest_client_requests_total")
                          .Help("Number of HTTP requests to the Kubernetes API, partitioned by "
                                "status code and method.")
                          .Register(*options.registry);
    impl->latency = &prometheus::BuildHistogram()
                         .Name("rest_client_request_duration_seconds")
                         .Help("Request latency to the Kubernetes API in seconds, by verb.")
                         .Register(*options.registry);
  }
  return std::unique_ptr<RestClient>(new RestClient(std::move(impl)));
}

RestClient::RestClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RestClient::~RestClient() = default;

std::string RestClient::server() const { return impl_->config.server; }
const std::string& RestClient::default_namespace() const { return impl_->config.namespace_name; }

absl::StatusOr<ApiResponse> RestClient::Request(std::string_view method,
                                                std::string_view path_and_query,
                                                const nlohmann::json* body,
                                                std::string_view content_type) {
  return Send(method, path_and_query, body, content_type, /*parse_success_body=*/true);
}

absl::StatusOr<ApiResponse> RestClient::RequestStatusOnly(std::string_view method,
                                                          std::string_view path_and_query,
                                                          const nlohmann::json* body,
                                                          std::string_view content_type) {
  return Send(method, path_and_query, body, content_type, /*parse_success_body=*/false);
}

absl::StatusOr<ApiResponse> RestClient::Send(std::string_view method,
                                             std::string_view path_and_query,
                                             const nlohmann::json* body,
                                             std::string_view content_type,
                                             bool parse_success_body) {
  std::string upper(method);
  absl::AsciiStrToUpper(&upper);
  std::optional<std::string> body_text;
  if (body != nullptr && !body->is_null()) body_text = body->dump();
  const bool idempotent = IsIdempotent(upper);
  for (int attempt = 0;; ++attempt) {
    impl_->limiter->Wait();
    auto start = std::chrono::steady_clock::now();
    Impl::Attempt result =
        impl_->Once(upper, path_and_query, body_text ? &*body_text : nullptr, content_type);
    auto elapsed = std::chrono::steady_clock::now() - start;
    impl_->Record(upper, upper,
                  result.transport_error ? kErrorCode : std::to_string(result.status), elapsed);
    const bool can_retry = attempt < impl_->options.max_retries;
    if (result.transport_error) {
      if (can_retry && (idempotent || !result.maybe_sent)) {
        SleepOn(impl_->clock, absl::FromChrono(impl_->Backoff(attempt)));
        continue;
      }
      std::string message = absl::StrCat(upper, " ", impl_->config.server, std::string(path_and_query), ": ",
                                         result.error, " (after ", attempt + 1, " attempt",
                                         attempt == 0 ? "" : "s", ")");
      if (result.timed_out) return absl::DeadlineExceededError(message);
      return absl::UnavailableError(message);
    }
    const int code = result.status;
    const bool retryable_code =
        code == 429 || code == 503 || (code >= 500 && code <= 599 && idempotent);
    if (retryable_code && can_retry) {
      std::chrono::nanoseconds sleep = impl_->Backoff(attempt);
      if (result.retry_after) {
        sleep = std::max<std::chrono::nanoseconds>(
            sleep, std::min<std::chrono::nanoseconds>(*result.retry_after,
                                                      impl_->options.max_retry_after));
      }
      spdlog::debug("kube client: {} {} answered {}; retrying in {} ms", upper,
                    std::string(path_and_query), code,
                    std::chrono::duration_cast<std::chrono::milliseconds>(sleep).count());
      SleepOn(impl_->clock, absl::FromChrono(sleep));
      continue;
    }
    ApiResponse response;
    response.status_code = code;
    if (parse_success_body || !response.ok()) response.body = ParseBody(result.body);
    return response;
  }
}

void RestClient::RequestStatusOnlyAsync(std::string method, std::string path_and_query,
                                        const nlohmann::json* body, StatusOnlyCallback done) {
  absl::AsciiStrToUpper(&method);
  std::optional<nlohmann::json> body_copy;
  std::string body_text;
  if (body != nullptr && !body->is_null()) {
    body_copy = *body;
    body_text = body->dump();
  }
  // What the attempt did not settle goes through the blocking path, with its
  // backoff and retries, off the pool.
  auto retry = [this, method, path_and_query, body_copy, done] {
    std::thread([this, method, path_and_query, body_copy, done] {
      SleepOn(impl_->clock, absl::FromChrono(impl_->Backoff(0)));
      done(RequestStatusOnly(method, path_and_query, body_copy ? &*body_copy : nullptr));
    }).detach();
  };
  impl_->limiter->Wait();
  const auto start = std::chrono::steady_clock::now();
  const bool idempotent = IsIdempotent(method);
  try {
    http_request req = impl_->MakeRequest(method, path_and_query);
    if (body_copy) req.set_body(body_text, "application/json");
    impl_->client->request(req).then([this, method, path_and_query, idempotent, start, retry,
                                      done](pplx::task<http_response> answer) {
      // Settles one attempt: a final answer goes to `done`, the rest to `retry`.
      auto settle = [=, this](Impl::Attempt out) {
        impl_->Record(method, method, out.transport_error ? kErrorCode : std::to_string(out.status),
                      std::chrono::steady_clock::now() - start);
        if (out.transport_error) {
          if (idempotent || !out.maybe_sent) return retry();
          std::string message = absl::StrCat(method, " ", impl_->config.server, path_and_query,
                                             ": ", out.error, " (after 1 attempt)");
          return done(out.timed_out ? absl::DeadlineExceededError(message)
                                    : absl::UnavailableError(message));
        }
        const int code = out.status;
        if (code == 429 || code == 503 || (code >= 500 && code <= 599 && idempotent)) {
          return retry();
        }
        ApiResponse response;
        response.status_code = code;
        if (!response.ok()) response.body = ParseBody(out.body);
        done(std::move(response));
      };
      http_response resp;
      try {
        resp = answer.get();
      } catch (const std::exception& e) {
        Impl::Attempt out;
        Impl::Classify(e, out);
        return settle(std::move(out));
      }
      resp.extract_vector().then([settle, status = resp.status_code()](
                                     pplx::task<std::vector<unsigned char>> bytes) {
        Impl::Attempt out;
        try {
          std::vector<unsigned char> b = bytes.get();
          out.status = status;
          out.body.assign(b.begin(), b.end());
        } catch (const std::exception& e) {
          Impl::Classify(e, out);
        }
        settle(std::move(out));
      });
    });
  } catch (const std::exception& e) {
    // Building the request failed (a malformed path): nothing was sent.
    Impl::Attempt out;
    Impl::Classify(e, out);
    impl_->Record(method, method, kErrorCode, std::chrono::steady_clock::now() - start);
    done(absl::InvalidArgumentError(absl::StrCat(method, " ", impl_->config.server,
                                                 path_and_query, ": ", out.error)));
  }
}

namespace {

// The next piece of a streamed body into `chunk`; 0 when the stream ended.
// The body buffer completes a getn only once `count` bytes are there (or the
// stream ends), and watch events are small: wait for one byte, then take
// whatever else has arrived. Throws what cpprestsdk throws.
size_t ReadAvailable(concurrency::streams::streambuf<uint8_t>& body, std::vector<uint8_t>& chunk) {
  size_t n = body.getn(chunk.data(), 1).get();
  if (n == 1) {
    const size_t more = std::min(body.in_avail(), chunk.size() - 1);
    if (more > 0) n += body.getn(chunk.data() + 1, more).get();
  }
  return n;
}

}  // namespace

absl::Status RestClient::Watch(std::string_view path_and_query,
                               const std::function<bool(const WatchEvent&)>& on_event,
                               std::stop_token stop) {
  if (stop.stop_requested()) return absl::OkStatus();
  const std::string url = absl::StrCat(impl_->config.server, std::string(path_and_query));
  http_client_config config = impl_->http_config;
  if (auto timeout = TimeoutSecondsOf(path_and_query); timeout && *timeout > 0) {
    config.set_timeout(std::chrono::seconds(*timeout + 30));
  } else {
    config.set_timeout(impl_->options.watch_idle_timeout);
  }
  http_client client(impl_->base_uri, config);
  pplx::cancellation_token_source cancel;
  // Closing the connection is what wakes a blocked read: cpprestsdk closes the
  // socket when the request's cancellation token fires.
  std::stop_callback on_stop(stop, [&cancel] { cancel.cancel(); });

  auto start = std::chrono::steady_clock::now();
  http_response resp;
  try {
    resp = client.request(impl_->MakeRequest("GET", path_and_query), cancel.get_token()).get();
  } catch (const std::exception& e) {
    impl_->Record("GET", "WATCH", kErrorCode, std::chrono::steady_clock::now() - start);
    if (stop.stop_requested()) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("watch ", url, ": ", e.what()));
  }
  const int code = resp.status_code();
  impl_->Record("GET", "WATCH", std::to_string(code), std::chrono::steady_clock::now() - start);
  if (code < 200 || code > 299) {
    std::string text;
    try {
      std::vector<unsigned char> bytes = resp.extract_vector().get();
      text.assign(bytes.begin(), bytes.end());
    } catch (const std::exception&) {
      // The status line is enough to report.
    }
    on_event(WatchEvent{"ERROR", AsStatus(code, ParseBody(text))});
    return absl::OkStatus();
  }

  auto body = resp.body().streambuf();
  WatchStreamParser parser;
  std::vector<uint8_t> chunk(64 * 1024);
  while (true) {
    size_t n = 0;
    try {
      n = ReadAvailable(body, chunk);
    } catch (const std::exception& e) {
      if (stop.stop_requested()) return absl::OkStatus();
      return absl::UnavailableError(absl::StrCat("watch ", url, ": stream broke after ",
                                                 parser.events(), " events: ", e.what()));
    }
    if (stop.stop_requested()) {
      cancel.cancel();
      return absl::OkStatus();
    }
    if (n == 0) {
      // The server ended the stream (timeoutSeconds), or the connection closed.
      return parser.Finish(on_event);
    }
    absl::Status st = parser.Feed(
        std::string_view(reinterpret_cast<const char*>(chunk.data()), n), on_event);
    if (!st.ok()) {
      cancel.cancel();
      return absl::DataLossError(absl::StrCat("watch ", url, ": ", st.message()));
    }
    if (parser.stopped()) {
      cancel.cancel();
      return absl::OkStatus();
    }
  }
}

absl::StatusOr<ApiResponse> RestClient::Stream(std::string_view path_and_query,
                                               const std::function<bool(std::string_view)>& on_data,
                                               std::stop_token stop) {
  const std::string url = absl::StrCat(impl_->config.server, std::string(path_and_query));
  http_client_config config = impl_->http_config;
  config.set_timeout(impl_->options.watch_idle_timeout);
  http_client client(impl_->base_uri, config);
  pplx::cancellation_token_source cancel;
  std::stop_callback on_stop(stop, [&cancel] { cancel.cancel(); });
  ApiResponse response;
  auto start = std::chrono::steady_clock::now();
  http_response resp;
  try {
    resp = client.request(impl_->MakeRequest("GET", path_and_query), cancel.get_token()).get();
  } catch (const std::exception& e) {
    impl_->Record("GET", "GET", kErrorCode, std::chrono::steady_clock::now() - start);
    if (stop.stop_requested()) return response;
    return absl::UnavailableError(absl::StrCat("GET ", url, ": ", e.what()));
  }
  response.status_code = resp.status_code();
  impl_->Record("GET", "GET", std::to_string(response.status_code),
                std::chrono::steady_clock::now() - start);
  if (!response.ok()) {
    std::string text;
    try {
      std::vector<unsigned char> bytes = resp.extract_vector().get();
      text.assign(bytes.begin(), bytes.end());
    } catch (const std::exception&) {
      // The status code is enough to report.
    }
    response.body = ParseBody(text);
    return response;
  }
  auto body = resp.body().streambuf();
  std::vector<uint8_t> chunk(64 * 1024);
  while (true) {
    size_t n = 0;
    try {
      n = ReadAvailable(body, chunk);
    } catch (const std::exception& e) {
      if (stop.stop_requested()) return response;
      return absl::UnavailableError(absl::StrCat("GET ", url, ": stream broke: ", e.what()));
    }
    if (stop.stop_requested() || n == 0) {
      cancel.cancel();
      return response;
    }
    if (!on_data(std::string_view(reinterpret_cast<const char*>(chunk.data()), n))) {
      cancel.cancel();
      return response;
    }
  }
}

absl::Status WatchStreamParser::Deliver(std::string_view line,
                                        const std::function<bool(const WatchEvent&)>& on_event) {
  nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("type") ||
      !parsed["type"].is_string() || !parsed.contains("object")) {
    std::string excerpt(line.substr(0, 80));
    return absl::DataLossError(absl::StrCat(
        "watch stream: the line at byte offset ", offset_,
        " is not a {\"type\", \"object\"} JSON event: ", excerpt, line.size() > 80 ? "..." : ""));
  }
  ++events_;
  WatchEvent event{parsed["type"].get<std::string>(), std::move(parsed["object"])};
  if (!on_event(event)) stopped_ = true;
  return absl::OkStatus();
}

absl::Status WatchStreamParser::Feed(std::string_view bytes,
                                     const std::function<bool(const WatchEvent&)>& on_event) {
  if (stopped_) return absl::OkStatus();
  size_t begin = 0;
  while (begin < bytes.size()) {
    size_t newline = bytes.find('\n', begin);
    if (newline == std::string_view::npos) {
      pending_.append(bytes.substr(begin));
      if (pending_.size() > kMaxLineBytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "watch stream: an event starting at byte offset ", offset_, " exceeds ",
            kMaxLineBytes, " bytes"));
      }
      return absl::OkStatus();
    }
    std::string_view piece = bytes.substr(begin, newline - begin);
    std::string joined;
    std::string_view line = piece;
    if (!pending_.empty()) {
      joined = std::move(pending_);
      pending_.clear();
      joined.append(piece);
      line = joined;
    }
    const size_t consumed = line.size() + 1;
    if (!absl::StripAsciiWhitespace(absl::string_view(line.data(), line.size())).empty()) {
      if (absl::Status st = Deliver(line, on_event); !st.ok()) return st;
    }
    offset_ += static_cast<int64_t>(consumed);
    begin = newline + 1;
    if (stopped_) return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status WatchStreamParser::Finish(const std::function<bool(const WatchEvent&)>& on_event) {
  if (stopped_ || absl::StripAsciiWhitespace(pending_).empty()) return absl::OkStatus();
  std::string line = std::move(pending_);
  pending_.clear();
  nlohmann::json parsed = nlohmann::json::parse(line, nullptr, false);
  if (parsed.is_discarded()) {
    return absl::DataLossError(absl::StrCat("watch stream: truncated event at byte offset ",
                                            offset_, " (", line.size(), " bytes without a newline)"));
  }
  return Deliver(line, on_event);
}

}  // namespace distrain::kube
