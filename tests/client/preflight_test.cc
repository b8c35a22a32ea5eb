// `ulyssesctl preflight storage` (client/storage_preflight.h) on a local directory, on the same
// directory behind a rate-limited writer, and with a stated bandwidth: the bandwidth and a FITS /
// DOES NOT FIT verdict for configs/jobs/llama3-8b-1m.yaml.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "client/cli.h"
#include "common/contract/exit.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"

namespace ulysses::client {
namespace {

struct CliRun {
  int code = -1;
  std::string out, err;
  nlohmann::json json() const { return nlohmann::json::parse(out); }
};

CliRun Preflight(std::vector<std::string> args) {
  const char* src = std::getenv("ULYSSES_SOURCE_DIR");
  std::vector<std::string> argv = {
      "ulyssesctl", "preflight", "storage", "-f",
      std::string(src ? src : ".") + "/configs/jobs/llama3-8b-1m.yaml"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<const char*> c;
  for (const std::string& a : argv) c.push_back(a.c_str());
  std::ostringstream out, err;
  CliRun r;
  r.code = RunCli(static_cast<int>(c.size()), c.data(), out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// The verdicts agree with the figures: save = checkpoint / bandwidth, fits = step + save <= grace.
void ExpectConsistent(const nlohmann::json& j) {
  const double bw = j["bandwidth_bytes_per_s"];
  const double grace = j["grace_seconds"];
  bool all = true;
  ASSERT_EQ(j["stages"].size(), 4u);
  for (const auto& s : j["stages"]) {
    EXPECT_NEAR(double(s["save_seconds"]), double(s["checkpoint_bytes"]) / bw,
                1e-6 * double(s["save_seconds"]));
    const bool fits = double(s["step_seconds"]) + double(s["save_seconds"]) <= grace;
    EXPECT_EQ(bool(s["fits"]), fits);
    all = all && fits;
  }
  EXPECT_EQ(bool(j["fits"]), all);
  // The 8B job's checkpoint: 14 bytes per parameter (bf16 weights, fp32 master and moments).
  EXPECT_NEAR(double(j["stages"][3]["checkpoint_bytes"]), 14 * 8.03e9, 0.01 * 14 * 8.03e9);
}

TEST(PreflightStorageTest, MeasuresALocalDirectoryAndLeavesNothingThere) {
  ::ulysses::testing::TempDir dir("preflight");
  const CliRun r = Preflight({"--dir", dir.path(), "--bytes", "64MiB", "-o", "json"});
  ASSERT_TRUE(r.code == contract::kExitOk || r.code == contract::kExitFailure) << r.err;
  const nlohmann::json j = r.json();
  EXPECT_GT(double(j["bandwidth_bytes_per_s"]), 0);
  EXPECT_EQ(double(j["probe"]["bytes"]), 64.0 * (1 << 20));
  EXPECT_EQ(int(j["probe"]["writers"]), 8);
  ExpectConsistent(j);
  EXPECT_EQ(r.code, bool(j["fits"]) ? contract::kExitOk : contract::kExitFailure);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));  // The probe files are gone.
}

TEST(PreflightStorageTest, ARateLimitedWriterDoesNotFitThe8bJob) {
  ::ulysses::testing::TempDir dir("preflight");
  CliRun r = Preflight({"--dir", dir.path(), "--bytes", "16MiB", "--limit-rate", "16MiB/s"});
  EXPECT_EQ(r.code, contract::kExitFailure) << r.out << r.err;
  EXPECT_NE(r.out.find("DOES NOT FIT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verdict: DOES NOT FIT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("paced to 16MiB/s"), std::string::npos) << r.out;
  r = Preflight({"--dir", dir.path(), "--bytes", "16MiB", "--limit-rate", "16MiB/s", "-o", "json"});
  const nlohmann::json j = r.json();
  // Pacing only slows the writers: the measured rate cannot exceed the limit.
  EXPECT_LE(double(j["bandwidth_bytes_per_s"]), 16.0 * (1 << 20) * 1.01);
  ExpectConsistent(j);
  EXPECT_FALSE(bool(j["fits"]));
  EXPECT_GT(double(j["needed_bytes_per_s"]), double(j["bandwidth_bytes_per_s"]));
}

TEST(PreflightStorageTest, AStatedFilestoreBandwidthAndTheGraceDecide) {
  // A 2 TiB zonal Filestore (~176 MiB/s): the 1M stage's step + 112 GB save exceed 900 s.
  CliRun r = Preflight({"--bandwidth", "176MiB/s", "-o", "json"});
  EXPECT_EQ(r.code, contract::kExitFailure) << r.err;
  nlohmann::json j = r.json();
  ExpectConsistent(j);
  EXPECT_FALSE(bool(j["stages"][3]["fits"]));
  EXPECT_TRUE(bool(j["stages"][0]["fits"]));
  r = Preflight({"--bandwidth", "176MiB/s", "--grace-s", "1500", "-o", "json"});
  EXPECT_EQ(r.code, contract::kExitOk) << r.err;
  EXPECT_TRUE(bool(r.json()["fits"]));
}

TEST(PreflightStorageTest, BadInputNamesTheFlag) {
  CliRun r = Preflight({"--dir", "/nonexistent/ulysses"});
  EXPECT_EQ(r.code, contract::kExitBadInput);
  EXPECT_NE(r.err.find("--dir: /nonexistent/ulysses is not a directory"), std::string::npos)
      << r.err;
  r = Preflight({});
  EXPECT_EQ(r.code, contract::kExitBadInput);
  EXPECT_NE(r.err.find("--dir DIR"), std::string::npos) << r.err;
  r = Preflight({"--bandwidth", "fast"});
  EXPECT_EQ(r.code, contract::kExitBadInput);
  EXPECT_NE(r.err.find("--bandwidth"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ulysses::client
