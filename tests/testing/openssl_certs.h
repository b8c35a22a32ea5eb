// OpensslCerts: a throwaway PKI for TLS tests, made once per test binary with the
// openssl CLI in a temp dir, in the layout of scripts/dev_certs.sh:
//   ca.pem/ca.key, server.pem/server.key (SAN DNS:localhost, IP:127.0.0.1, IP:::1),
//   workers/<name>.pem/.key (CN=<name>, SAN DNS:<name>, clientAuth) for each name asked,
//   plus other-ca.pem, a CA that signed nothing here (for "wrong CA" cases).
// Thread-compatible; Get() is safe to call from tests (function-local static).
#ifndef ULYSSES_TESTS_TESTING_OPENSSL_CERTS_H_
#define ULYSSES_TESTS_TESTING_OPENSSL_CERTS_H_

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/testing/temp_dir.h"

namespace ulysses::testing {

class OpensslCerts {
 public:
  // Workers w1 and w2.
  static const OpensslCerts& Get() {
    static const OpensslCerts* certs = new OpensslCerts({"w1", "w2"});
    return *certs;
  }
  bool ok() const { return ok_; }
  // Why making them failed (openssl's stderr).
  std::string log() const { return Read("openssl.log"); }
  std::string Path(const std::string& name) const { return dir_.Sub(name); }
  std::string Read(const std::string& name) const {
    std::ifstream in(Path(name));
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  explicit OpensslCerts(std::initializer_list<std::string> workers) {
    std::string script =
        "set -e\n"
        "cd \"$1\"; shift; exec 2>openssl.log; mkdir -p workers\n"
        "key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out \"$1\"; }\n"
        "sign() {  # sign KEY CERT SUBJECT EXT\n"
        "  openssl req -new -key \"$1\" -subj \"$3\" -out req.csr\n"
        "  openssl x509 -req -in req.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \\\n"
        "    -sha256 -extfile \"$4\" -out \"$2\"\n"
        "}\n"
        "for ca in ca other-ca; do\n"
        "  key $ca.key\n"
        "  openssl req -x509 -new -key $ca.key -sha256 -days 2 -subj /CN=$ca \\\n"
        "    -addext basicConstraints=critical,CA:TRUE \\\n"
        "    -addext keyUsage=critical,keyCertSign,cRLSign -out $ca.pem\n"
        "done\n"
        "printf 'basicConstraints=CA:FALSE\\nextendedKeyUsage=serverAuth\\n"
        "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\\n' >server.ext\n"
        "key server.key; sign server.key server.pem /CN=ulysses-coordinator server.ext\n"
        "for w in \"$@\"; do\n"
        "  printf 'basicConstraints=CA:FALSE\\nextendedKeyUsage=clientAuth\\n"
        "subjectAltName=DNS:%s\\n' $w >w.ext\n"
        "  key workers/$w.key; sign workers/$w.key workers/$w.pem /CN=$w w.ext\n"
        "done\n";
    std::ofstream(dir_.Sub("make.sh")) << script;
    std::string command = "bash " + dir_.Sub("make.sh") + " " + dir_.path();
    for (const std::string& w : workers) command += " " + w;
    ok_ = std::system(command.c_str()) == 0;
  }

  TempDir dir_{"ulysses-test-certs"};
  bool ok_ = false;
};

}  // namespace ulysses::testing

#endif  // ULYSSES_TESTS_TESTING_OPENSSL_CERTS_H_
