// DevCerts: development TLS certificates for tests, made by scripts/dev_certs.sh (the
// same script users run) into one temp dir per test binary. The first call runs the
// script; later calls that name new workers run it again (it is idempotent and only
// adds the new worker certificates). Thread-safe.
//
// Needs $ULYSSES_SOURCE_DIR (ctest sets it) to find the script; aborts the test binary
// with a message otherwise, or when the script fails (no test can go on without certs).
#ifndef ULYSSES_TESTS_TESTING_CERTS_H_
#define ULYSSES_TESTS_TESTING_CERTS_H_

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tests/testing/files.h"
#include "tests/testing/temp_dir.h"

namespace ulysses::testing {

struct DevCerts {
  std::string dir;
  std::string ca;           // dir/ca.pem
  std::string ca_key;       // dir/ca.key
  std::string server_cert;  // dir/server.pem (SAN localhost, 127.0.0.1, ::1)
  std::string server_key;   // dir/server.key
  std::string WorkerCert(const std::string& name) const {
    return dir + "/workers/" + name + ".pem";
  }
  std::string WorkerKey(const std::string& name) const { return dir + "/workers/" + name + ".key"; }
};

// The binary's certificates, with a client certificate for each of `workers`.
inline const DevCerts& TestCerts(const std::vector<std::string>& workers = {}) {
  static std::mutex mu;
  static TempDir* dir = nullptr;  // Lives until exit (removed by its destructor then).
  static std::set<std::string> made;
  static DevCerts certs;
  std::lock_guard<std::mutex> lock(mu);
  std::string missing;
  for (const std::string& w : workers) {
    if (made.count(w) == 0) missing += " '" + w + "'";
  }
  if (dir != nullptr && missing.empty()) return certs;
  const char* source_dir = std::getenv("ULYSSES_SOURCE_DIR");
  if (source_dir == nullptr) {
    std::fprintf(stderr, "TestCerts: $ULYSSES_SOURCE_DIR is unset (run the test through ctest)\n");
    std::abort();
  }
  if (dir == nullptr) {
    static TempDir owned("ulysses-certs");
    dir = &owned;
    certs.dir = dir->path();
    certs.ca = certs.dir + "/ca.pem";
    certs.ca_key = certs.dir + "/ca.key";
    certs.server_cert = certs.dir + "/server.pem";
    certs.server_key = certs.dir + "/server.key";
  }
  std::string cmd = std::string("bash '") + source_dir + "/scripts/dev_certs.sh' '" + certs.dir +
                    "'" + missing + " >/dev/null";
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "TestCerts: \"%s\" failed\n", cmd.c_str());
    std::abort();
  }
  for (const std::string& w : workers) made.insert(w);
  return certs;
}

// The CA certificate of a second, independent dev CA that signed nothing the
// binary's TestCerts use (for "wrong CA" cases).
inline std::string OtherCaFile() {
  static std::mutex mu;
  static TempDir* dir = nullptr;  // Lives until exit.
  std::lock_guard<std::mutex> lock(mu);
  if (dir == nullptr) {
    const char* source_dir = std::getenv("ULYSSES_SOURCE_DIR");
    if (source_dir == nullptr) {
      std::fprintf(stderr, "OtherCaFile: $ULYSSES_SOURCE_DIR is unset (run through ctest)\n");
      std::abort();
    }
    static TempDir owned("ulysses-other-ca");
    const std::string cmd = std::string("bash '") + source_dir + "/scripts/dev_certs.sh' '" +
                            owned.path() + "' >/dev/null";
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "OtherCaFile: \"%s\" failed\n", cmd.c_str());
      std::abort();
    }
    dir = &owned;
  }
  return dir->path() + "/ca.pem";
}

}  // namespace ulysses::testing

#endif  // ULYSSES_TESTS_TESTING_CERTS_H_
