#include "common/job_identity.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace distrain {
namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, Free>;
using CertPtr = std::unique_ptr<X509, Free>;
using BioPtr = std::unique_ptr<BIO, Free>;

// OpenSSL's most recent error, for messages.
std::string OpenSslError() {
  unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return buf;
}

absl::Status Fail(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", OpenSslError()));
}

absl::StatusOr<KeyPtr> NewEcKey() {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (key == nullptr) return Fail("generating an EC P-256 key");
  return key;
}

absl::StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr)) {
    return Fail("writing a private key");
  }
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<std::string> CertPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_X509(bio.get(), cert)) return Fail("writing a certificate");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// A certificate and its key as PEM text.
absl::StatusOr<TaskCredentials> Pems(X509* cert, EVP_PKEY* key) {
  absl::StatusOr<std::string> cert_pem = CertPem(cert);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = KeyPem(key);
  if (!key_pem.ok()) return key_pem.status();
  return TaskCredentials{*std::move(cert_pem), *std::move(key_pem)};
}

absl::StatusOr<CertPtr> ParseCert(const std::string& pem, const std::string& what) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  CertPtr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a PEM certificate"));
  }
  return cert;
}

absl::StatusOr<KeyPtr> ParseKey(const std::string& pem, const std::string& what) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a PEM private key"));
  }
  return key;
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  std::unique_ptr<X509_EXTENSION, Free> ext(
      X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (ext == nullptr || !X509_add_ext(cert, ext.get(), -1)) {
    return Fail(absl::StrCat("adding the certificate extension ", value));
  }
  return absl::OkStatus();
}

// A certificate for `key` named `common_name`, signed by `issuer_key` (the
// issuer's certificate, or null for a self-signed one). Extensions are
// "nid=value" pairs applied in order.
absl::StatusOr<CertPtr> MakeCert(EVP_PKEY* key, const std::string& common_name,
                                 EVP_PKEY* issuer_key, X509* issuer, absl::Duration validity,
                                 const std::vector<std::pair<int, std::string>>& extensions) {
  CertPtr cert(X509_new());
  if (cert == nullptr) return Fail("allocating a certificate");
  X509_set_version(cert.get(), 2);  // v3
  // A random 127-bit serial: unique without a registry of issued serials.
  unsigned char serial_bytes[16];
  if (RAND_bytes(serial_bytes, sizeof(serial_bytes)) != 1) return Fail("drawing a serial number");
  serial_bytes[0] &= 0x7f;
  std::unique_ptr<BIGNUM, decltype(&BN_free)> bn(
      BN_bin2bn(serial_bytes, sizeof(serial_bytes), nullptr), &BN_free);
  if (bn == nullptr || BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert.get())) == nullptr) {
    return Fail("setting the serial number");
  }
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -300);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), absl::ToInt64Seconds(validity));
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>("distrain"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                             0);
  X509_set_issuer_name(cert.get(), issuer != nullptr ? X509_get_subject_name(issuer) : name);
  if (!X509_set_pubkey(cert.get(), key)) return Fail("setting the public key");
  for (const auto& [nid, value] : extensions) {
    if (absl::Status s = AddExtension(cert.get(), issuer != nullptr ? issuer : cert.get(), nid,
                                      value);
        !s.ok()) {
      return s;
    }
  }
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0) return Fail("signing a certificate");
  return cert;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream out;
  out << in.rdbuf();
  std::string text = out.str();
  if (text.size() > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is over 1 MiB; not a credential"));
  }
  return text;
}

absl::Status WriteFile0600(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      return absl::InternalError(absl::StrCat("writing ", tmp, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0 || rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("writing ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string TaskServerName(const TaskId& task) {
  return absl::StrCat(task.type, "-", task.index, ".task.distrain");
}

absl::StatusOr<TaskId> ParseTaskCommonName(const std::string& common_name) {
  std::vector<std::string> parts = absl::StrSplit(common_name, ':');
  int index = -1;
  if (parts.size() != 2 ||
      (parts[0] != "chief" && parts[0] != "worker" && parts[0] != "ps" &&
       parts[0] != "evaluator") ||
      !absl::SimpleAtoi(parts[1], &index) || index < 0 || parts[1] != std::to_string(index)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "certificate common name \"", common_name,
        "\" does not name a task (expected chief:0, worker:N, ps:N or evaluator:0)"));
  }
  return TaskId{parts[0], index};
}

absl::StatusOr<JobAuthority> NewJobAuthority(const std::string& job_name,
                                             absl::Duration validity) {
  absl::StatusOr<KeyPtr> key = NewEcKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<CertPtr> cert =
      MakeCert(key->get(), absl::StrCat("distrain job CA ", job_name), key->get(), nullptr,
               validity,
               {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                {NID_key_usage, "critical,keyCertSign,cRLSign"},
                {NID_subject_key_identifier, "hash"}});
  if (!cert.ok()) return cert.status();
  absl::StatusOr<TaskCredentials> pems = Pems(cert->get(), key->get());
  if (!pems.ok()) return pems.status();
  JobAuthority authority;
  authority.ca_cert_pem = std::move(pems->cert_pem);
  authority.ca_key_pem = std::move(pems->key_pem);
  unsigned char ring_key[32];
  if (RAND_bytes(ring_key, sizeof(ring_key)) != 1) return Fail("drawing the ring key");
  authority.ring_key_hex =
      absl::BytesToHexString(std::string(reinterpret_cast<char*>(ring_key), 32));
  return authority;
}

absl::StatusOr<TaskCredentials> IssueTaskCredentials(const JobAuthority& authority,
                                                     const TaskId& task,
                                                     absl::Duration validity) {
  absl::StatusOr<CertPtr> ca = ParseCert(authority.ca_cert_pem, "the job CA certificate");
  if (!ca.ok()) return ca.status();
  absl::StatusOr<KeyPtr> ca_key = ParseKey(authority.ca_key_pem, "the job CA key");
  if (!ca_key.ok()) return ca_key.status();
  absl::StatusOr<KeyPtr> key = NewEcKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<CertPtr> cert =
      MakeCert(key->get(), task.ToString(), ca_key->get(), ca->get(), validity,
               {{NID_basic_constraints, "critical,CA:FALSE"},
                {NID_key_usage, "critical,digitalSignature,keyEncipherment"},
                {NID_ext_key_usage, "serverAuth,clientAuth"},
                {NID_subject_alt_name, absl::StrCat("DNS:", TaskServerName(task))},
                {NID_authority_key_identifier, "keyid"}});
  if (!cert.ok()) return cert.status();
  return Pems(cert->get(), key->get());
}

absl::StatusOr<LoadedCredentials> CheckCredentials(const std::string& ca_cert_pem,
                                                   const TaskCredentials& task,
                                                   const std::string& ring_key_hex) {
  absl::StatusOr<CertPtr> ca = ParseCert(ca_cert_pem, kCredentialsCaFile);
  if (!ca.ok()) return ca.status();
  absl::StatusOr<CertPtr> cert = ParseCert(task.cert_pem, kCredentialsCertFile);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<KeyPtr> key = ParseKey(task.key_pem, kCredentialsKeyFile);
  if (!key.ok()) return key.status();
  if (X509_check_private_key(cert->get(), key->get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(kCredentialsKeyFile, " is not the key of ",
                                                   kCredentialsCertFile));
  }
  std::unique_ptr<X509_STORE, Free> store(X509_STORE_new());
  std::unique_ptr<X509_STORE_CTX, Free> ctx(X509_STORE_CTX_new());
  X509_STORE_add_cert(store.get(), ca->get());
  X509_STORE_CTX_init(ctx.get(), store.get(), cert->get(), nullptr);
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(kCredentialsCertFile, " is not valid under ",
                                                   kCredentialsCaFile, ": ",
                                                   X509_verify_cert_error_string(err)));
  }
  char cn[256] = {};
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert->get()), NID_commonName, cn,
                                sizeof(cn)) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(kCredentialsCertFile, " has no common name"));
  }
  absl::StatusOr<TaskId> who = ParseTaskCommonName(cn);
  if (!who.ok()) return who.status();
  std::string ring_key;
  const std::string hex(absl::StripAsciiWhitespace(ring_key_hex));
  if (hex.size() != 64 || !absl::c_all_of(hex, [](char c) { return absl::ascii_isxdigit(c); })) {
    return absl::InvalidArgumentError(
        absl::StrCat(kCredentialsRingKeyFile, " must hold 64 hex digits (a 256-bit key)"));
  }
  ring_key = absl::HexStringToBytes(hex);
  return LoadedCredentials{*who, ca_cert_pem, task.cert_pem, task.key_pem, std::move(ring_key)};
}

absl::StatusOr<LoadedCredentials> LoadCredentialsDir(const std::string& dir) {
  std::string texts[4];
  const char* files[4] = {kCredentialsCaFile, kCredentialsCertFile, kCredentialsKeyFile,
                          kCredentialsRingKeyFile};
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<std::string> text = ReadSmallFile(absl::StrCat(dir, "/", files[i]));
    if (!text.ok()) return text.status();
    texts[i] = *std::move(text);
  }
  absl::StatusOr<LoadedCredentials> loaded =
      CheckCredentials(texts[0], TaskCredentials{texts[1], texts[2]}, texts[3]);
  if (!loaded.ok()) {
    return absl::Status(loaded.status().code(),
                        absl::StrCat("credentials in ", dir, ": ", loaded.status().message()));
  }
  return loaded;
}

absl::Status WriteCredentialsDir(const std::string& dir, const JobAuthority& authority,
                                 const TaskCredentials& task) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
  }
  const std::pair<const char*, const std::string*> files[] = {
      {kCredentialsCaFile, &authority.ca_cert_pem},
      {kCredentialsCertFile, &task.cert_pem},
      {kCredentialsKeyFile, &task.key_pem},
      {kCredentialsRingKeyFile, &authority.ring_key_hex}};
  for (const auto& [name, bytes] : files) {
    if (absl::Status s = WriteFile0600(absl::StrCat(dir, "/", name), *bytes); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace distrain
