#include "worker/engine/checkpoint/checkpoint.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/testing/files.h"
#include "tests/testing/temp_dir.h"
#include "worker/engine/checkpoint/async_checkpoint.h"

namespace ulysses::engine {
namespace {

namespace fs = std::filesystem;

using ::ulysses::testing::TempDir;

// A reusable barrier for `n` threads; `hook(k)` runs on the last arriver of the k-th
// barrier (0-based) before anyone is released.
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int n, std::function<absl::Status(int)> hook = nullptr)
      : n_(n), hook_(std::move(hook)) {}
  absl::Status Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t gen = generation_;
    if (++arrived_ == n_) {
      if (hook_) result_ = hook_(static_cast<int>(gen));
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return result_;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
    return result_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::function<absl::Status(int)> hook_;
  absl::Status result_;
};

CheckpointState MakeState(int64_t step, uint64_t seed = 1) {
  torch::manual_seed(seed);
  CheckpointState s;
  s.stage = 1;
  s.step_in_stage = step - 10;
  s.global_step = step;
  s.stage_complete = step % 2 == 0;
  s.spec_hash = "abc123";
  s.tensors = {{"model/model.embed_tokens.weight", torch::randn({17, 8})},
               {"optim/exp_avg/model.norm.weight", torch::randn({8}, torch::kFloat64)},
               {"optim/step", torch::tensor({step}, torch::kInt64)},
               {"extra/bytes", torch::randint(0, 255, {33}, torch::kUInt8)},
               {"model/empty", torch::zeros({0, 4})},
               {"model/half", torch::randn({3, 5}).to(torch::kBFloat16)},
               {"model/lm_head.weight", torch::randn({17, 8}).t()}};  // non-contiguous
  s.extra = {{"data_position", step * 4}, {"world", {{"sp", 2}, {"dp", 1}}}};
  return s;
}

absl::StatusOr<std::string> SaveParallel(const std::string& root, const CheckpointState& state,
                                         int world, int64_t keep_last,
                                         std::function<absl::Status(int)> hook = nullptr) {
  ThreadBarrier barrier(world, std::move(hook));
  std::vector<absl::StatusOr<std::string>> results(world, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      results[r] = SaveCheckpoint(root, state, r, world, keep_last, [&] { return barrier.Wait(); });
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 1; r < world; ++r) {
    if (results[r].ok() != results[0].ok()) return absl::InternalError("ranks disagree");
  }
  return results[0];
}

void ExpectSameState(const CheckpointState& a, const CheckpointState& b) {
  EXPECT_EQ(a.stage, b.stage);
  EXPECT_EQ(a.step_in_stage, b.step_in_stage);
  EXPECT_EQ(a.global_step, b.global_step);
  EXPECT_EQ(a.stage_complete, b.stage_complete);
  EXPECT_EQ(a.spec_hash, b.spec_hash);
  EXPECT_EQ(a.extra, b.extra);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_EQ(a.tensors[i].tensor.scalar_type(), b.tensors[i].tensor.scalar_type());
    EXPECT_TRUE(torch::equal(a.tensors[i].tensor, b.tensors[i].tensor)) << a.tensors[i].name;
  }
}

TEST(CheckpointTest, Crc32KnownValue) {
  EXPECT_EQ(Crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(Crc32("6789", 4, Crc32("12345", 5)), 0xCBF43926u);
  EXPECT_EQ(Crc32("The quick brown fox jumps over the lazy dog", 43), 0x414FA339u);
}

// The eight-bytes-at-a-time CRC equals the bitwise definition at every length and alignment
// (the 8-byte loop, its tail, and chaining through the initial value).
TEST(CheckpointTest, Crc32MatchesBitwiseDefinitionAtEveryLengthAndAlignment) {
  auto bitwise = [](const uint8_t* p, size_t n, uint32_t crc) {
    crc = ~crc;
    for (size_t i = 0; i < n; ++i) {
      crc ^= p[i];
      for (int k = 0; k < 8; ++k) crc = (crc & 1) ? 0xEDB88320u ^ (crc >> 1) : crc >> 1;
    }
    return ~crc;
  };
  std::vector<uint8_t> bytes(300);
  uint32_t x = 12345;
  for (uint8_t& b : bytes) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 16);
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n + offset <= 80; ++n) {
      ASSERT_EQ(Crc32(bytes.data() + offset, n), bitwise(bytes.data() + offset, n, 0))
          << "offset " << offset << " length " << n;
    }
  }
  const uint32_t head = Crc32(bytes.data(), 97);
  EXPECT_EQ(Crc32(bytes.data() + 97, 203, head), bitwise(bytes.data(), 300, 0));
}

TEST(CheckpointTest, RoundTripAcrossWorldSizes) {
  for (int world : {1, 2, 3}) {
    TempDir root;
    const CheckpointState state = MakeState(12);
    auto dir = SaveParallel(root.path(), state, world, 2);
    ASSERT_TRUE(dir.ok()) << dir.status();
    EXPECT_EQ(*dir, root.path() + "/step-00000012");
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(fs::exists(*dir + "/shard-" + std::to_string(r) + "-of-" + std::to_string(world) +
                             ".bin"));
    }
    auto latest = LatestCommittedCheckpoint(root.path());
    ASSERT_TRUE(latest.ok());
    EXPECT_EQ(*latest, *dir);
    auto loaded = LoadCheckpoint(*latest, "abc123");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ExpectSameState(state, *loaded);
    auto bytes = CheckpointBytes(*dir);
    ASSERT_TRUE(bytes.ok());
    EXPECT_GT(*bytes, 17 * 8 * 4 * 2);
  }
}

TEST(CheckpointTest, ResumeAtDifferentWorldAndOverwriteSameStep) {
  TempDir root;
  ASSERT_TRUE(SaveParallel(root.path(), MakeState(20, 1), 4, 2).ok());
  // Same step saved again with world 2 and different contents: replaces it.
  const CheckpointState second = MakeState(20, 2);
  auto dir = SaveParallel(root.path(), second, 2, 2);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_FALSE(fs::exists(*dir + "/shard-3-of-4.bin"));  // stale layout cleaned
  auto loaded = LoadCheckpoint(*dir, "");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameState(second, *loaded);
}

TEST(CheckpointTest, CorruptByteIsACrcErrorNamingTheShard) {
  TempDir root;
  auto dir = SaveParallel(root.path(), MakeState(4), 2, 2);
  ASSERT_TRUE(dir.ok());
  const std::string shard = *dir + "/shard-1-of-2.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    char c;
    f.read(&c, 1);
    c ^= 0x5a;
    f.seekp(-3, std::ios::end);
    f.write(&c, 1);
  }
  auto loaded = LoadCheckpoint(*dir, "");
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(loaded.status().message().find("shard-1-of-2.bin"), std::string::npos)
      << loaded.status();
  EXPECT_NE(loaded.status().message().find("crc32 mismatch"), std::string::npos) << loaded.status();
}

TEST(CheckpointTest, BadMagicTruncatedAndMissingShard) {
  TempDir root;
  auto dir = SaveParallel(root.path(), MakeState(4), 2, 2);
  ASSERT_TRUE(dir.ok());
  const std::string shard0 = *dir + "/shard-0-of-2.bin";
  const std::string backup = root.path() + "/backup.bin";
  fs::copy_file(shard0, backup);

  fs::resize_file(shard0, fs::file_size(shard0) - 10);
  auto truncated = LoadCheckpoint(*dir, "");
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("shard-0-of-2.bin"), std::string::npos);
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos)
      << truncated.status();

  fs::resize_file(shard0, 20);
  auto tiny = LoadCheckpoint(*dir, "");
  EXPECT_NE(tiny.status().message().find("truncated"), std::string::npos) << tiny.status();

  fs::copy_file(backup, shard0, fs::copy_options::overwrite_existing);
  ASSERT_TRUE(LoadCheckpoint(*dir, "").ok());
  {
    std::fstream f(shard0, std::ios::in | std::ios::out | std::ios::binary);
    f.write("XX", 2);
  }
  auto magic = LoadCheckpoint(*dir, "");
  EXPECT_NE(magic.status().message().find("bad magic"), std::string::npos) << magic.status();

  fs::remove(shard0);
  auto missing = LoadCheckpoint(*dir, "");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("shard-0-of-2.bin is missing"), std::string::npos)
      << missing.status();
}

TEST(CheckpointTest, ForeignSpecHash) {
  TempDir root;
  auto dir = SaveParallel(root.path(), MakeState(4), 1, 2);
  ASSERT_TRUE(dir.ok());
  auto loaded = LoadCheckpoint(*dir, "zzz999");
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(loaded.status().message().find("was written for spec hash abc123, this job is zzz999"),
            std::string::npos)
      << loaded.status();
}

TEST(CheckpointTest, MissingManifestIsNotCommitted) {
  TempDir root;
  EXPECT_EQ(LatestCommittedCheckpoint(root.path()).status().code(), absl::StatusCode::kNotFound);
  auto first = SaveParallel(root.path(), MakeState(10), 2, 3);
  ASSERT_TRUE(first.ok());
  // Crash between shards and manifest: the job dies at the barrier after the shards.
  auto crashed = SaveParallel(root.path(), MakeState(11), 2, 3, [](int k) {
    return k == 1 ? absl::UnavailableError("peer died") : absl::OkStatus();
  });
  ASSERT_FALSE(crashed.ok());
  EXPECT_TRUE(fs::exists(root.path() + "/step-00000011/shard-0-of-2.bin"));
  EXPECT_FALSE(fs::exists(root.path() + "/step-00000011/manifest.json"));
  auto latest = LatestCommittedCheckpoint(root.path());
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, *first);
  auto not_committed = LoadCheckpoint(root.path() + "/step-00000011", "");
  EXPECT_EQ(not_committed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(not_committed.status().message().find("not committed"), std::string::npos);
  // The next successful save removes the stale uncommitted dir (older than newest committed).
  ASSERT_TRUE(SaveParallel(root.path(), MakeState(12), 2, 3).ok());
  EXPECT_FALSE(fs::exists(root.path() + "/step-00000011"));
  EXPECT_TRUE(fs::exists(root.path() + "/step-00000010"));
}

TEST(CheckpointTest, RetentionKeepsNewest) {
  TempDir root;
  for (int64_t step : {2, 4, 6, 8})
    ASSERT_TRUE(SaveParallel(root.path(), MakeState(step), 2, 2).ok());
  EXPECT_FALSE(fs::exists(root.path() + "/step-00000002"));
  EXPECT_FALSE(fs::exists(root.path() + "/step-00000004"));
  EXPECT_TRUE(fs::exists(root.path() + "/step-00000006/manifest.json"));
  EXPECT_TRUE(fs::exists(root.path() + "/step-00000008/manifest.json"));
  // keep_last 0 is treated as 1: the newest committed is never deleted.
  ASSERT_TRUE(SaveParallel(root.path(), MakeState(9), 1, 0).ok());
  EXPECT_FALSE(fs::exists(root.path() + "/step-00000008"));
  EXPECT_TRUE(fs::exists(root.path() + "/step-00000009/manifest.json"));
  // An unrelated directory is left alone.
  fs::create_directories(root.path() + "/notes");
  ASSERT_TRUE(SaveParallel(root.path(), MakeState(10), 1, 1).ok());
  EXPECT_TRUE(fs::exists(root.path() + "/notes"));
}

CheckpointState OwnedState(int64_t step, const std::string& tenant, const std::string& job,
                           bool adopt = false) {
  CheckpointState s = MakeState(step);
  s.owner = {tenant, job};
  s.adopt = adopt;
  return s;
}

// Before (b145c41) a manifest did not say which job wrote it: a job given another job's
// directory resumed from its weights and its retention (keep_last) deleted them. Now the owner is
// in the manifest, CheckCheckpointOwner refuses another job's (another tenant's always, the same
// tenant's without adopt), and retention neither counts nor removes a checkpoint it refuses.
TEST(CheckpointTest, AManifestNamesItsJobAndAnotherJobNeitherResumesNorPrunesIt) {
  TempDir root;
  auto alice = SaveParallel(root.path(), OwnedState(4, "research", "job-000001"), 2, 1);
  ASSERT_TRUE(alice.ok()) << alice.status();
  absl::StatusOr<CheckpointState> info = ReadCheckpointInfo(*alice, "abc123");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->owner.tenant, "research");
  EXPECT_EQ(info->owner.job_id, "job-000001");

  const CheckpointOwner bob{"other", "job-000002"}, alice2{"research", "job-000003"};
  absl::Status refused = CheckCheckpointOwner(*alice, info->owner, bob, /*adopt=*/true);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("another tenant's job, this is job job-000002"),
            std::string::npos)
      << refused;
  EXPECT_EQ(refused.message().find("job-000001"), std::string::npos) << refused;
  absl::Status unadopted = CheckCheckpointOwner(*alice, info->owner, alice2, false);
  EXPECT_EQ(unadopted.code(), absl::StatusCode::kFailedPrecondition) << unadopted;
  EXPECT_NE(unadopted.message().find("written by job job-000001, this is job job-000003"),
            std::string::npos)
      << unadopted;
  EXPECT_TRUE(CheckCheckpointOwner(*alice, info->owner, alice2, /*adopt=*/true).ok());
  EXPECT_TRUE(CheckCheckpointOwner(*alice, info->owner, info->owner, false).ok());
  EXPECT_TRUE(CheckCheckpointOwner(*alice, info->owner, CheckpointOwner{}, false).ok());

  // Bob's saves into the same root with keep_last 1 leave alice's checkpoint alone.
  ASSERT_TRUE(SaveParallel(root.path(), OwnedState(6, "other", "job-000002"), 2, 1).ok());
  ASSERT_TRUE(SaveParallel(root.path(), OwnedState(8, "other", "job-000002"), 1, 1).ok());
  EXPECT_TRUE(fs::exists(*alice + "/manifest.json"));
  EXPECT_FALSE(fs::exists(root.path() + "/step-00000006"));
  EXPECT_TRUE(fs::exists(root.path() + "/step-00000008/manifest.json"));
  // Alice's next job adopting the directory prunes her tenant's, not bob's.
  ASSERT_TRUE(SaveParallel(root.path(), OwnedState(10, "research", "job-000003", true), 1, 1).ok());
  EXPECT_FALSE(fs::exists(*alice));
  EXPECT_TRUE(fs::exists(root.path() + "/step-00000008/manifest.json"));
}

TEST(CheckpointTest, ManifestIsWrittenLast) {
  TempDir root;
  const std::string dir = root.path() + "/step-00000014";
  bool checked = false;
  auto saved = SaveParallel(root.path(), MakeState(14), 2, 2, [&](int k) {
    if (k == 1) {  // after every shard is written, before rank 0 commits
      EXPECT_TRUE(fs::exists(dir + "/shard-0-of-2.bin"));
      EXPECT_TRUE(fs::exists(dir + "/shard-1-of-2.bin"));
      EXPECT_FALSE(fs::exists(dir + "/manifest.json"));
      checked = true;
    }
    if (k == 2) EXPECT_TRUE(fs::exists(dir + "/manifest.json"));
    return absl::OkStatus();
  });
  ASSERT_TRUE(saved.ok());
  EXPECT_TRUE(checked);
  const auto manifest_time = fs::last_write_time(dir + "/manifest.json");
  EXPECT_GE(manifest_time, fs::last_write_time(dir + "/shard-0-of-2.bin"));
  EXPECT_GE(manifest_time, fs::last_write_time(dir + "/shard-1-of-2.bin"));
  EXPECT_FALSE(fs::exists(dir + "/manifest.json.tmp"));
}

TEST(CheckpointTest, ForkedProcessesShareAFileBarrier) {
  // Two real processes, synchronised through files in the directory.
  TempDir root;
  const CheckpointState state = MakeState(30);
  auto file_barrier = [&](int rank, int& gen) {
    return [&, rank]() -> absl::Status {
      const std::string mine =
          root.path() + "/b" + std::to_string(gen) + "-" + std::to_string(rank);
      std::ofstream(mine).put('x');
      const std::string other =
          root.path() + "/b" + std::to_string(gen) + "-" + std::to_string(1 - rank);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!fs::exists(other)) {
        if (std::chrono::steady_clock::now() > deadline)
          return absl::DeadlineExceededError("barrier");
        std::this_thread::yield();
      }
      ++gen;
      return absl::OkStatus();
    };
  };
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int gen = 0;
    auto r = SaveCheckpoint(root.path() + "/ckpt", state, 1, 2, 2, file_barrier(1, gen));
    _exit(r.ok() ? 0 : 1);
  }
  int gen = 0;
  auto r = SaveCheckpoint(root.path() + "/ckpt", state, 0, 2, 2, file_barrier(0, gen));
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  auto loaded = LoadCheckpoint(*r, "abc123");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameState(state, *loaded);
}

// ---- Sharded loading (LoadCheckpointShare) ----

// A ZeRO-like checkpoint of `world` ranks: "model/w" [10, 7] float32 and "optim/m" [5] float64 in
// pieces of ceil(n / world) elements (rank r owns [r*c, min(n, (r+1)*c)), none when empty), and a
// whole "meta/ids" int64 [3] written by rank 0. Returns the step dir; `whole` gets the tensors.
absl::StatusOr<std::string> SaveOwned(const std::string& root, int world,
                                      std::map<std::string, torch::Tensor>& whole) {
  torch::manual_seed(5);
  whole = {{"model/w", torch::randn({10, 7})},
           {"optim/m", torch::randn({5}, torch::kFloat64)},
           {"meta/ids", torch::tensor({4, 5, 6}, torch::kInt64)}};
  ThreadBarrier barrier(world);
  std::vector<absl::StatusOr<std::string>> results(world, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      CheckpointState st;
      st.global_step = 3;
      st.spec_hash = "abc123";
      for (const char* name : {"model/w", "optim/m"}) {
        const torch::Tensor& t = whole.at(name);
        const int64_t n = t.numel(), c = (n + world - 1) / world;
        const int64_t begin = std::min(n, r * c), end = std::min(n, (r + 1) * c);
        if (begin == end) continue;
        NamedTensor nt;
        nt.name = name;
        nt.tensor = t.reshape({-1}).narrow(0, begin, end - begin).clone();  // [n] -> my piece
        nt.full_shape = t.sizes().vec();
        nt.offset = begin;
        st.tensors.push_back(std::move(nt));
      }
      if (r == 0) st.tensors.push_back({"meta/ids", whole.at("meta/ids")});
      results[r] = SaveCheckpoint(
          root, st, r, world, 2, [&] { return barrier.Wait(); }, SaveMode::kOwned);
    });
  }
  for (auto& t : threads) t.join();
  return results[0];
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void WriteJson(const std::string& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump();
}

TEST(CheckpointShareTest, ManifestRecordsEveryPiecesShardOffset) {
  TempDir root;
  std::map<std::string, torch::Tensor> whole;
  auto dir = SaveOwned(root.path(), 4, whole);
  ASSERT_TRUE(dir.ok()) << dir.status();
  const nlohmann::json manifest = ReadJson(*dir + "/manifest.json");
  ASSERT_EQ(manifest["tensors"].size(), 4u + 3u + 1u);  // w: 4 pieces, m: 3 (rank 3 owns none)
  for (const auto& t : manifest["tensors"]) {
    ASSERT_TRUE(t.contains("offset")) << t.dump();
    // The bytes at that offset are the entry's (its CRC matches).
    std::ifstream in(*dir + "/shard-" + std::to_string(t["shard"].get<int>()) + "-of-4.bin",
                     std::ios::binary);
    std::string bytes(t["bytes"].get<size_t>(), '\0');
    in.seekg(t["offset"].get<int64_t>());
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_EQ(Crc32(bytes.data(), bytes.size()), t["crc32"].get<uint32_t>()) << t.dump();
  }
}

TEST(CheckpointShareTest, ReadsOnlyThePiecesOverlappingTheKeptRange) {
  TempDir root;
  std::map<std::string, torch::Tensor> whole;
  auto dir = SaveOwned(root.path(), 4, whole);  // model/w: pieces [0,18) [18,36) [36,54) [54,70)
  ASSERT_TRUE(dir.ok()) << dir.status();
  ShareRequest request;
  request["model/w"] = {{10, 7}, 20, 40};  // overlaps the pieces of ranks 1 and 2 only
  request["optim/m"] = {{5}};              // whole: 3 pieces
  request["not/there"] = {{1}};            // absent: no error, no tensor
  LoadStats stats;
  auto st = LoadCheckpointShare(*dir, "abc123", request, &stats);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(stats.data_bytes, (18 + 18) * 4 + 5 * 8);  // meta/ids and pieces 0, 3 never read
  EXPECT_GT(stats.metadata_bytes, 0);
  ASSERT_EQ(st->tensors.size(), 2u);
  std::map<std::string, NamedTensor> got;
  for (auto& t : st->tensors) got[t.name] = t;
  const NamedTensor& w = got.at("model/w");
  ASSERT_TRUE(w.full_shape.has_value());
  EXPECT_EQ(*w.full_shape, (std::vector<int64_t>{10, 7}));
  EXPECT_EQ(w.offset, 20);
  EXPECT_TRUE(torch::equal(w.tensor, whole.at("model/w").reshape({-1}).narrow(0, 20, 20)));
  EXPECT_FALSE(got.at("optim/m").full_shape.has_value());
  EXPECT_TRUE(torch::equal(got.at("optim/m").tensor, whole.at("optim/m")));
  // Every layout reads each stored byte at most once over its ranks: the four chunks of W=3.
  int64_t total = 0;
  for (int r = 0; r < 3; ++r) {
    ShareRequest mine;
    mine["model/w"] = {{10, 7}, std::min<int64_t>(70, r * 24), std::min<int64_t>(70, r * 24 + 24)};
    LoadStats s;
    auto part = LoadCheckpointShare(*dir, "", mine, &s);
    ASSERT_TRUE(part.ok()) << part.status();
    EXPECT_TRUE(torch::equal(part->tensors[0].tensor,
                             whole.at("model/w").reshape({-1}).narrow(0, r * 24, r < 2 ? 24 : 22)));
    EXPECT_LE(s.data_bytes, (24 + 2 * 18) * 4) << r;  // its range plus at most two edge pieces
    total += s.data_bytes;
  }
  EXPECT_LT(total, 2 * 70 * 4);
}

TEST(CheckpointShareTest, RangeOfAWholeTensorStreamsItAndChecksItsCrc) {
  TempDir root;
  const CheckpointState state = MakeState(20);
  auto dir = SaveParallel(root.path(), state, 2, 2);
  ASSERT_TRUE(dir.ok());
  ShareRequest request;
  request["model/model.embed_tokens.weight"] = {{17, 8}, 30, 50};
  LoadStats stats;
  auto st = LoadCheckpointShare(*dir, "", request, &stats);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(stats.data_bytes, 17 * 8 * 4);  // the whole entry, for its CRC; only 20 kept
  ASSERT_EQ(st->tensors.size(), 1u);
  EXPECT_TRUE(
      torch::equal(st->tensors[0].tensor, state.tensors[0].tensor.reshape({-1}).narrow(0, 30, 20)));
}

TEST(CheckpointShareTest, OldManifestWithoutOffsetsLoadsThroughTheShardTables) {
  TempDir root;
  std::map<std::string, torch::Tensor> whole;
  auto dir = SaveOwned(root.path(), 4, whole);
  ASSERT_TRUE(dir.ok());
  auto before = LoadCheckpoint(*dir, "");
  ASSERT_TRUE(before.ok()) << before.status();
  nlohmann::json manifest = ReadJson(*dir + "/manifest.json");
  for (auto& t : manifest["tensors"]) t.erase("offset");
  WriteJson(*dir + "/manifest.json", manifest);
  auto after = LoadCheckpoint(*dir, "");
  ASSERT_TRUE(after.ok()) << after.status();
  ExpectSameState(*before, *after);
  EXPECT_TRUE(torch::equal(after->tensors[0].tensor, whole.at(after->tensors[0].name)));
  ShareRequest request;
  request["model/w"] = {{10, 7}, 0, 18};
  LoadStats stats;
  ASSERT_TRUE(LoadCheckpointShare(*dir, "", request, &stats).ok());
  EXPECT_EQ(stats.data_bytes, 18 * 4);
  EXPECT_GT(stats.metadata_bytes, static_cast<int64_t>(manifest.dump().size()));  // + the table
}

TEST(CheckpointShareTest, BadInputIsAnErrorNamingFileTensorAndFix) {
  TempDir root;
  std::map<std::string, torch::Tensor> whole;
  auto dir = SaveOwned(root.path(), 4, whole);
  ASSERT_TRUE(dir.ok());
  // A model of another shape.
  ShareRequest request;
  request["model/w"] = {{7, 10}};
  auto shape = LoadCheckpointShare(*dir, "", request);
  ASSERT_FALSE(shape.ok());
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kFailedPrecondition);
  for (const char* part : {"model/w", "[10, 7]", "[7, 10]", "shard-0-of-4.bin", "model_config"}) {
    EXPECT_NE(shape.status().message().find(part), std::string::npos) << shape.status();
  }
  // Pieces that do not tile the tensor (a piece moved by one element).
  const std::string path = *dir + "/manifest.json";
  const nlohmann::json good = ReadJson(path);
  nlohmann::json bad = good;
  for (auto& t : bad["tensors"]) {
    if (t["name"] == "model/w" && t["elem_offset"] == 36) t["elem_offset"] = 37;
  }
  WriteJson(path, bad);
  request["model/w"] = {{10, 7}};
  auto tiling = LoadCheckpointShare(*dir, "", request);
  ASSERT_FALSE(tiling.ok());
  EXPECT_EQ(tiling.status().code(), absl::StatusCode::kDataLoss);
  for (const char* part : {"model/w", "do not tile", "manifest.json", "older step dir"}) {
    EXPECT_NE(tiling.status().message().find(part), std::string::npos) << tiling.status();
  }
  // A truncated shard, even one this request would not read.
  WriteJson(path, good);
  fs::resize_file(*dir + "/shard-3-of-4.bin", fs::file_size(*dir + "/shard-3-of-4.bin") - 1);
  request.clear();
  request["meta/ids"] = {{3}};
  auto truncated = LoadCheckpointShare(*dir, "", request);
  ASSERT_FALSE(truncated.ok());
  for (const char* part :
       {"shard-3-of-4.bin", "truncated", "older step dir", ": tensor ", "is cut"}) {
    EXPECT_NE(truncated.status().message().find(part), std::string::npos) << truncated.status();
  }
}

// ---- Asynchronous saves (async_checkpoint.h) ----

// Every file of a committed step dir, name -> bytes.
std::map<std::string, std::string> DirFiles(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    files[e.path().filename().string()] = ::ulysses::testing::ReadFile(e.path());
  }
  return files;
}

// `world` ranks as threads, each with its own AsyncCheckpointer, saving `states` one after
// another (Begin returns before the write; the next Begin waits for it). Each rank saves its own
// deep copy of the state; `between` gets that copy on the rank's thread right after Begin
// returned. Returns each rank's results of Poll() and, after the last save, Wait().
std::vector<std::vector<absl::StatusOr<AsyncSaveDone>>> SaveAsyncParallel(
    const std::string& root, const std::vector<CheckpointState>& states, int world,
    SaveMode mode = SaveMode::kReplicated, std::function<void(CheckpointState&)> between = nullptr,
    std::function<CheckpointState(int, const CheckpointState&)> per_rank = nullptr) {
  ThreadBarrier barrier(world);
  std::vector<std::vector<absl::StatusOr<AsyncSaveDone>>> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      AsyncCheckpointOptions o;
      o.root = root;
      o.rank = r;
      o.world = world;
      o.keep_last = 10;
      o.mode = mode;
      o.commit_timeout = std::chrono::seconds(30);
      AsyncCheckpointer ckpt(o);
      for (size_t k = 0; k < states.size(); ++k) {
        CheckpointState mine = per_rank ? per_rank(r, states[k]) : states[k];
        for (auto& nt : mine.tensors) nt.tensor = nt.tensor.clone();
        absl::StatusOr<double> blocked = ckpt.Begin(mine, [&] { return barrier.Wait(); });
        if (!blocked.ok()) {
          results[r].push_back(blocked.status());
          return;
        }
        if (between) between(mine);
        if (k + 1 == states.size()) {
          auto done = ckpt.Wait();
          if (done) results[r].push_back(*done);
        } else if (auto done = ckpt.Poll()) {
          results[r].push_back(*done);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(AsyncCheckpointTest, AsyncAndSyncSavesWriteByteIdenticalFiles) {
  TempDir sync_root, async_root;
  const CheckpointState state = MakeState(40);
  for (int world : {1, 3}) {
    const std::string sub = "/w" + std::to_string(world);
    auto sync_dir = SaveParallel(sync_root.path() + sub, state, world, 2);
    ASSERT_TRUE(sync_dir.ok()) << sync_dir.status();
    auto results = SaveAsyncParallel(async_root.path() + sub, {state}, world);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(results[r].size(), 1u) << "rank " << r;
      ASSERT_TRUE(results[r][0].ok()) << results[r][0].status();
    }
    const std::string async_dir = results[0][0]->path;
    EXPECT_EQ(fs::path(async_dir).filename(), fs::path(*sync_dir).filename());
    const auto sync_files = DirFiles(*sync_dir), async_files = DirFiles(async_dir);
    EXPECT_EQ(sync_files.size(), static_cast<size_t>(world) + 1);  // shards + manifest
    ASSERT_EQ(sync_files.size(), async_files.size());
    for (const auto& [name, bytes] : sync_files) {
      ASSERT_TRUE(async_files.count(name)) << name;
      EXPECT_TRUE(async_files.at(name) == bytes) << name << " differs (world " << world << ")";
    }
  }
}

TEST(AsyncCheckpointTest, OwnedPiecesAsyncMatchSync) {
  // ZeRO-style pieces: each rank saves its half of one tensor.
  TempDir sync_root, async_root;
  CheckpointState state = MakeState(41);
  const torch::Tensor whole = torch::arange(10, torch::kFloat32);
  auto rank_state = [&](int r, const CheckpointState& s) {
    CheckpointState mine = s;
    mine.tensors.clear();
    NamedTensor piece;
    piece.name = "model/w";
    piece.tensor = whole.narrow(0, r * 5, 5);
    piece.full_shape = std::vector<int64_t>{10};
    piece.offset = r * 5;
    mine.tensors.push_back(piece);
    return mine;
  };
  ThreadBarrier barrier(2);
  std::vector<absl::StatusOr<std::string>> sync(2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      sync[r] = SaveCheckpoint(
          sync_root.path(), rank_state(r, state), r, 2, 2, [&] { return barrier.Wait(); },
          SaveMode::kOwned);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(sync[0].ok()) << sync[0].status();
  auto results =
      SaveAsyncParallel(async_root.path(), {state}, 2, SaveMode::kOwned, nullptr, rank_state);
  ASSERT_EQ(results[0].size(), 1u);
  ASSERT_TRUE(results[0][0].ok()) << results[0][0].status();
  EXPECT_EQ(DirFiles(*sync[0]), DirFiles(results[0][0]->path));
  auto loaded = LoadCheckpoint(results[0][0]->path, "abc123");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->tensors.size(), 1u);
  EXPECT_TRUE(torch::equal(loaded->tensors[0].tensor, whole));
}

TEST(AsyncCheckpointTest, SnapshotIsTakenBeforeBeginReturns) {
  // The training thread changes its tensors in place right after Begin: the checkpoint holds
  // the values at Begin, for every save of a sequence of saves into one root.
  TempDir root;
  const std::vector<CheckpointState> states = {MakeState(50), MakeState(52), MakeState(54)};
  auto results =
      SaveAsyncParallel(root.path(), states, 2, SaveMode::kReplicated, [](CheckpointState& live) {
        for (auto& nt : live.tensors) {
          if (nt.tensor.numel() > 0) nt.tensor.add_(1);
        }
      });
  for (int r = 0; r < 2; ++r) {
    for (const auto& result : results[r]) ASSERT_TRUE(result.ok()) << result.status();
  }
  for (const CheckpointState& state : states) {
    auto loaded = LoadCheckpoint(root.path() + "/" + StepDirName(state.global_step), "abc123");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ExpectSameState(state, *loaded);
  }
  auto latest = LatestCommittedCheckpoint(root.path());
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(fs::path(*latest).filename().string(), StepDirName(54));
}

TEST(AsyncCheckpointTest, FailedShardOfOneRankFailsTheCommitAndKeepsThePrevious) {
  TempDir root;
  const CheckpointState good = MakeState(60);
  ASSERT_TRUE(SaveParallel(root.path(), good, 2, 5).ok());
  CheckpointState bad = MakeState(62);
  // Index 1 is rank 1's in kReplicated: a dtype the format does not store fails its write.
  bad.tensors[1].tensor = torch::zeros({2}, torch::kComplexFloat);
  auto results = SaveAsyncParallel(root.path(), {bad}, 2);
  ASSERT_EQ(results[0].size(), 1u);
  ASSERT_FALSE(results[0][0].ok());
  EXPECT_NE(results[0][0].status().message().find("rank 1 could not write its shard"),
            std::string::npos)
      << results[0][0].status();
  EXPECT_NE(results[0][0].status().message().find("unsupported dtype"), std::string::npos)
      << results[0][0].status();
  ASSERT_EQ(results[1].size(), 1u);
  EXPECT_FALSE(results[1][0].ok());
  const std::string half = root.path() + "/" + StepDirName(62);
  EXPECT_FALSE(fs::exists(half + "/manifest.json"));
  auto latest = LatestCommittedCheckpoint(root.path());
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(fs::path(*latest).filename().string(), StepDirName(60));
}

TEST(AsyncCheckpointTest, NextBeginReturnsThePreviousSavesError) {
  TempDir root;
  CheckpointState bad = MakeState(70);
  bad.tensors[0].tensor = torch::zeros({2}, torch::kComplexFloat);
  AsyncCheckpointOptions o;
  o.root = root.path();
  AsyncCheckpointer ckpt(o);
  ASSERT_TRUE(ckpt.Begin(bad, [] { return absl::OkStatus(); }).ok());
  absl::StatusOr<double> next = ckpt.Begin(MakeState(72), [] { return absl::OkStatus(); });
  ASSERT_FALSE(next.ok());
  EXPECT_NE(next.status().message().find("previous asynchronous checkpoint failed"),
            std::string::npos)
      << next.status();
  EXPECT_FALSE(fs::exists(root.path() + "/" + StepDirName(72)));
}

}  // namespace
}  // namespace ulysses::engine
