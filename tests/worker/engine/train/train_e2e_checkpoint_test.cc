// End-to-end tests of ulysses-train's checkpoint and preemption paths (the rig:
// train_e2e_fixture.h):
//   - kill -9 in the middle of a checkpoint save (shards written, no manifest; held
//     there by the checkpoint.before_manifest failpoint): the previous checkpoint stays
//     the latest and loads, a rerun resumes from it bit-identically and re-commits
//     the half-written step; the same for an asynchronous save killed while its background
//     writer holds it there, and asynchronous saves write the same bytes as synchronous ones.
//   - SIGTERM with a grace shorter than a (held) step: exit 75 within the grace, the last finished
//     step committed, the rerun resumes from it bit-identically.
//   - a running rank takes a new checkpoint interval from its --control stdin channel.
#include "tests/worker/engine/train/train_e2e_fixture.h"

namespace {

using namespace ulysses::testing::train_e2e;  // NOLINT: the rig's vocabulary.

TEST_F(TrainE2eTest, KillNineMidCheckpointSaveResumesFromPreviousCommit) {
  namespace ck = ulysses::engine;
  const std::vector<std::string> sets = {
      "spec.parallelism.sp_degree=2", "spec.stages[0].steps=6", "spec.checkpoint.every_steps=2",
      "spec.checkpoint.keep_last=3", "spec.checkpoint.async=false"};
  Result ref = RunTrainer(TrainArgs("ref", sets));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  auto lref = Losses("ref");
  ASSERT_EQ(lref.size(), 6u);

  const fs::path ckpts = dir_ / "killed" / "checkpoints";
  const fs::path half = ckpts / ck::StepDirName(4);
  const fs::path marker = dir_ / "failpoint.hit";
  std::vector<std::string> argv = {TrainerBin()};
  for (auto& a : TrainArgs("killed", sets)) argv.push_back(a);
  Proc p = Start(argv, "killed", dir_,
                 {"ULYSSES_FAILPOINT=checkpoint.before_manifest@4",
                  "ULYSSES_FAILPOINT_MARKER=" + marker.string()});
  const bool hit = WaitForFile(marker, p);
  kill(-p.pid, SIGKILL);  // Launcher and both ranks: they share the process group.
  const int killed_code = Wait(p);
  ASSERT_TRUE(hit);
  EXPECT_EQ(killed_code, 128 + SIGKILL);
  const std::string killed_err = ReadFile(p.err);
  EXPECT_NE(killed_err.find("is ARMED"), std::string::npos) << killed_err;
  EXPECT_NE(killed_err.find("failpoint checkpoint.before_manifest reached at step 4"),
            std::string::npos)
      << killed_err;

  // The kill landed mid-save: both shards of step 4 written, no manifest.
  EXPECT_TRUE(fs::exists(half / "shard-0-of-2.bin"));
  EXPECT_TRUE(fs::exists(half / "shard-1-of-2.bin"));
  EXPECT_FALSE(fs::exists(half / ck::kManifestName));
  EXPECT_FALSE(fs::exists(half / "manifest.json.tmp"));
  const size_t lines_before = MetricLines("killed");
  EXPECT_EQ(lines_before, 4u) << "steps 1-4 were logged before the save of step 4";

  // 1. The previous checkpoint is still the latest committed one, and it is intact.
  absl::StatusOr<std::string> latest = ck::LatestCommittedCheckpoint(ckpts.string());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(fs::path(*latest).filename().string(), ck::StepDirName(2));
  absl::StatusOr<ck::CheckpointState> prev = ck::LoadCheckpoint(*latest, "");
  ASSERT_TRUE(prev.ok()) << prev.status();
  EXPECT_EQ(prev->global_step, 2);
  EXPECT_FALSE(prev->stage_complete);
  EXPECT_EQ(ck::LoadCheckpoint(half.string(), "").status().code(), absl::StatusCode::kNotFound);
  json ev = EvalJson(RunTrainer({"eval", "-f", job_, "--checkpoint", *latest}));
  EXPECT_GT(ev["tokens"].get<int64_t>(), 0);

  // 2. The same command (failpoint off) resumes from step 2 and finishes; the losses it
  // logs for steps 3-6 are bit-identical to the uninterrupted run's.
  Result resumed = RunTrainer(TrainArgs("killed", sets));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(resumed.err.find("failpoint"), std::string::npos) << resumed.err;
  std::vector<int64_t> steps;
  std::istringstream events(resumed.out);
  for (std::string line; std::getline(events, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.value("event", "") == "step")
      steps.push_back(j["step"].get<int64_t>());
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 4, 5, 6}));
  auto lk = Losses("killed", lines_before);
  ASSERT_EQ(lk.size(), 4u);
  for (auto& [step, loss] : lk) EXPECT_EQ(loss, lref[step]) << "step " << step;  // bit-identical

  // 3. The half-written step was re-committed; every checkpoint matches the uninterrupted
  // run's tensor for tensor (crc32s in the manifest) and has no leftover files.
  latest = ck::LatestCommittedCheckpoint(ckpts.string());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(fs::path(*latest).filename().string(), ck::StepDirName(6));
  for (int64_t step : {2, 4, 6}) {
    const fs::path dir = ckpts / ck::StepDirName(step);
    absl::StatusOr<ck::CheckpointState> st = ck::LoadCheckpoint(dir.string(), "");
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->global_step, step);
    json mk = json::parse(ReadFile((dir / ck::kManifestName).string()));
    json mr = json::parse(
        ReadFile((dir_ / "ref" / "checkpoints" / ck::StepDirName(step) / ck::kManifestName)));
    EXPECT_EQ(mk["tensors"], mr["tensors"]) << "step " << step;
    EXPECT_EQ(mk["total_bytes"], mr["total_bytes"]) << "step " << step;
    std::vector<std::string> files;
    for (auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    EXPECT_EQ(files,
              (std::vector<std::string>{"manifest.json", "shard-0-of-2.bin", "shard-1-of-2.bin"}))
        << dir;
  }
}

// An asynchronous save killed during its background write: rank 0's writer thread is held by
// the checkpoint.before_manifest failpoint at step 4 (both shards on disk, no manifest) while
// training goes on; kill -9 of the whole tree. Step 2 stays the latest committed checkpoint; the
// rerun resumes from it with losses bit-identical to an uninterrupted synchronous run, and every
// checkpoint file it writes (asynchronous saves at 2 and 4... and the final one) is byte-identical
// to the synchronous run's.
TEST_F(TrainE2eTest, KillNineDuringAsyncWriteKeepsPreviousAndAsyncFilesMatchSync) {
  namespace ck = ulysses::engine;
  const std::vector<std::string> sets = {"spec.parallelism.sp_degree=2", "spec.stages[0].steps=6",
                                         "spec.checkpoint.every_steps=2",
                                         "spec.checkpoint.keep_last=3"};
  std::vector<std::string> sync_sets = sets, async_sets = sets;
  sync_sets.push_back("spec.checkpoint.async=false");
  async_sets.push_back("spec.checkpoint.async=true");
  Result ref = RunTrainer(TrainArgs("ref", sync_sets));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  auto lref = Losses("ref");
  ASSERT_EQ(lref.size(), 6u);

  const fs::path ckpts = dir_ / "killed" / "checkpoints";
  const fs::path marker = dir_ / "failpoint.hit";
  std::vector<std::string> argv = {TrainerBin()};
  for (auto& a : TrainArgs("killed", async_sets)) argv.push_back(a);
  Proc p = Start(argv, "killed", dir_,
                 {"ULYSSES_FAILPOINT=checkpoint.before_manifest@4",
                  "ULYSSES_FAILPOINT_MARKER=" + marker.string()});
  const bool hit = WaitForFile(marker, p);
  kill(-p.pid, SIGKILL);
  EXPECT_EQ(Wait(p), 128 + SIGKILL);
  ASSERT_TRUE(hit);
  const std::string killed_err = ReadFile(p.err);
  EXPECT_NE(killed_err.find("checkpoints are asynchronous (spec.checkpoint.async: true"),
            std::string::npos)
      << killed_err;
  EXPECT_TRUE(fs::exists(ckpts / ck::StepDirName(4) / "shard-1-of-2.bin"));
  EXPECT_FALSE(fs::exists(ckpts / ck::StepDirName(4) / ck::kManifestName));
  const size_t lines_before = MetricLines("killed");
  EXPECT_GE(lines_before, 4u);
  EXPECT_LE(lines_before, 6u);  // the stage-end save waits for the held one
  absl::StatusOr<std::string> latest = ck::LatestCommittedCheckpoint(ckpts.string());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(fs::path(*latest).filename().string(), ck::StepDirName(2));
  ASSERT_TRUE(ck::LoadCheckpoint(*latest, "").ok());

  Result resumed = RunTrainer(TrainArgs("killed", async_sets));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  auto lk = Losses("killed", lines_before);
  ASSERT_FALSE(lk.empty());
  EXPECT_EQ(lk.begin()->first, 3);  // resumed from step 2
  for (auto& [step, loss] : lk) EXPECT_EQ(loss, lref[step]) << "step " << step;  // bit-identical
  int async_events = 0;
  std::istringstream events(resumed.out);
  for (std::string line; std::getline(events, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.value("event", "") == "checkpoint") {
      EXPECT_TRUE(j.contains("blocked_seconds")) << line;
      ++async_events;
    }
  }
  EXPECT_EQ(async_events, 2) << resumed.out;  // step 4 (asynchronous) and the stage end
  for (int64_t step : {2, 4, 6}) {
    const fs::path dir = ckpts / ck::StepDirName(step);
    const fs::path ref_dir = dir_ / "ref" / "checkpoints" / ck::StepDirName(step);
    for (const char* name : {"manifest.json", "shard-0-of-2.bin", "shard-1-of-2.bin"}) {
      ASSERT_TRUE(fs::exists(dir / name)) << dir / name;
      EXPECT_TRUE(ReadFile((dir / name).string()) == ReadFile((ref_dir / name).string()))
          << "step " << step << " " << name << " differs from the synchronous run's";
    }
  }
}

// A preemption notice shorter than a step (worker/engine/train/preemption.h): every rank's
// training thread is held in step 4 by the train.step failpoint (a step that never ends) while
// the asynchronous save of step 3 is in flight; SIGTERM to `ulysses-train train --stop-grace-s 5`
// (which forwards it with no deadline of its own, so a rank that waited for its step would never
// exit). The ranks leave on their own with exit 75, step 3 (the last finished step) committed and
// reported, and a rerun resumes at step 4 with losses bit-identical to an uninterrupted run.
TEST_F(TrainE2eTest, SigtermShorterThanAStepExits75WithTheLastFinishedStepCommitted) {
  const std::vector<std::string> sets = {"spec.parallelism.sp_degree=2", "spec.stages[0].steps=6",
                                         "spec.checkpoint.every_steps=1",
                                         "spec.checkpoint.async=true"};
  Result ref = RunTrainer(TrainArgs("ref", sets));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  auto lref = Losses("ref");
  ASSERT_EQ(lref.size(), 6u);

  const fs::path marker = dir_ / "failpoint.hit";
  std::vector<std::string> argv = {TrainerBin()};
  for (auto& a : TrainArgs("term", sets)) argv.push_back(a);
  argv.insert(argv.end(), {"--stop-grace-s", "5"});
  Proc p = Start(argv, "term", dir_,
                 {"ULYSSES_FAILPOINT=train.step@4", "ULYSSES_FAILPOINT_MARKER=" + marker.string()});
  ASSERT_TRUE(WaitForFile(marker, p));
  kill(p.pid, SIGTERM);
  const int code = Wait(p);
  const std::string err = ReadFile(p.err), out = ReadFile(p.out);
  ASSERT_EQ(code, 75) << err;
  EXPECT_NE(err.find("end within the grace; exiting 75"), std::string::npos) << err;
  EXPECT_EQ(LatestCommittedStep("term"), 3) << err;
  EXPECT_EQ(MetricLines("term"), 3u);  // step 4 never finished
  // Step 3's save was in flight when the step hung: the leaving rank 0 reported its commit.
  bool reported = false;
  std::istringstream events(out);
  for (std::string line; std::getline(events, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    reported = reported || (!j.is_discarded() && j.value("event", "") == "checkpoint" &&
                            j.value("step", -1) == 3);
  }
  EXPECT_TRUE(reported) << out;

  Result resumed = RunTrainer(TrainArgs("term", sets));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  auto lt = Losses("term", 3);
  ASSERT_FALSE(lt.empty());
  EXPECT_EQ(lt.begin()->first, 4) << "the rerun did not resume from step 3";
  for (auto& [step, loss] : lt) EXPECT_EQ(loss, lref[step]) << "step " << step;  // bit-identical
}

// The supervisor's channel to a running rank (`--control stdin`, common/contract/rank_control.h):
// a rank started without a periodic interval gets a line that breaks the protocol (logged,
// ignored) and then "every 3 steps"; it applies it at a step boundary (its log names the step)
// and from there commits every third step, none before.
TEST_F(TrainE2eTest, ARunningRankTakesANewCheckpointIntervalFromItsControlChannel) {
  int in[2];
  ASSERT_EQ(pipe(in), 0);
  const fs::path out = dir_ / "ctl";
  const std::string err_path = (dir_ / "ctl.err").string();
  const std::vector<std::string> argv = {TrainerBin(), "rank",
                                         "-f",         job_,
                                         "--out",      out.string(),
                                         "--control",  "stdin",
                                         "--set",      "spec.checkpoint.every_steps=0",
                                         "--set",      "spec.stages[0].steps=30"};
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  Proc p;
  p.err = err_path;
  p.out = (dir_ / "ctl.out").string();
  p.pid = fork();
  if (p.pid == 0) {
    setpgid(0, 0);
    dup2(in[0], 0);
    int o = open(p.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(p.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  close(in[0]);
  WaitForLines("ctl", 2, p);
  const std::string lines =
      "{\"control\":\"checkpoint_interval\",\"version\":0,\"every_steps\":1,\"every_seconds\":0,"
      "\"reason\":\"bad\"}\n"
      "{\"control\":\"checkpoint_interval\",\"version\":1,\"every_steps\":3,\"every_seconds\":0,"
      "\"reason\":\"test\"}\n";
  ASSERT_EQ(write(in[1], lines.data(), lines.size()), static_cast<ssize_t>(lines.size()));
  ASSERT_EQ(Wait(p), 0) << ReadFile(p.err);
  close(in[1]);
  const std::string err = ReadFile(p.err);
  EXPECT_NE(err.find("checkpoint_interval.version: 0"), std::string::npos) << err;
  const std::string applied = "checkpoint interval version 1 from step ";
  const size_t at = err.find(applied);
  ASSERT_NE(at, std::string::npos) << err;
  const int from = std::atoi(err.c_str() + at + applied.size());
  ASSERT_GT(from, 2);
  ASSERT_LT(from, 27) << "the stage ended before the interval arrived";
  std::set<int64_t> committed;
  std::istringstream events(ReadFile(p.out));
  for (std::string line; std::getline(events, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.value("event", "") == "checkpoint")
      committed.insert(j["step"].get<int64_t>());
  }
  std::set<int64_t> want;
  for (int64_t step = from; step < 30; ++step) {
    if (step % 3 == 0) want.insert(step);
  }
  want.insert(30);  // the stage end
  EXPECT_EQ(committed, want) << "applied from step " << from;
}

// A rank started for a stage that already finished (its final checkpoint committed, e.g. by a
// generation whose supervisor missed the commit: a coordinator restored from an older backup)
// trains nothing and reports that checkpoint, so the supervisor learns the stage's result.
TEST_F(TrainE2eTest, ARankOfAFinishedStageReportsItsFinalCheckpoint) {
  const std::vector<std::string> args = {
      "rank", "-f", job_, "--out", (dir_ / "done").string(), "--set", "spec.stages[0].steps=2"};
  Result first = RunTrainer(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  Result again = RunTrainer(args);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  std::vector<json> checkpoints;
  int steps = 0;
  std::istringstream events(again.out);
  for (std::string line; std::getline(events, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;
    if (j.value("event", "") == "checkpoint") checkpoints.push_back(j);
    if (j.value("event", "") == "step") ++steps;
  }
  EXPECT_EQ(steps, 0) << again.out;
  ASSERT_EQ(checkpoints.size(), 1u) << again.out;
  EXPECT_EQ(checkpoints[0].value("stage", -1), 0);
  EXPECT_EQ(checkpoints[0].value("step", -1), 2);
  EXPECT_EQ(checkpoints[0].value("seconds", -1.0), 0.0);
  EXPECT_FALSE(checkpoints[0].contains("blocked_seconds")) << "nothing was saved by this run";
  absl::StatusOr<std::string> latest =
      ulysses::engine::LatestCommittedCheckpoint((dir_ / "done" / "checkpoints").string());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(checkpoints[0].value("path", ""), *latest);
}

// A stage's RoPE ("ABF": stages[1].rope.rope_theta) reaches the model from that stage on: the
// first stage trains bit for bit as without it, the second does not; the checkpoints of the
// second record it, a kill -9 in the second stage resumes bit-identically, and export writes it
// into config.json.
TEST_F(TrainE2eTest, AStageRopeTrainsFromItsStageResumesBitIdenticallyAndIsExported) {
  const std::string plain = (dir_ / "plain.yaml").string(), abf = (dir_ / "abf.yaml").string();
  {
    std::string text = ReadFile(job_);
    const std::string one = "stages: [{seq_len: 128, steps: 20}]";
    const size_t at = text.find(one);
    ASSERT_NE(at, std::string::npos) << text;
    std::string two = text;
    two.replace(at, one.size(), "stages: [{seq_len: 64, steps: 4}, {seq_len: 128, steps: 8}]");
    std::ofstream(plain) << two;
    two = text;
    two.replace(at, one.size(),
                "stages: [{seq_len: 64, steps: 4}, {seq_len: 128, steps: 8, "
                "rope: {rope_theta: 1000000.0}}]");
    std::ofstream(abf) << two;
  }
  auto args = [&](const std::string& spec, const std::string& out) {
    return std::vector<std::string>{"train",
                                    "-f",
                                    spec,
                                    "--out",
                                    (dir_ / out).string(),
                                    "--set",
                                    "spec.checkpoint.every_steps=2"};
  };
  // (stage, step_in_stage) -> loss.
  auto losses = [&](const std::string& out) {
    std::map<std::pair<int64_t, int64_t>, double> m;
    std::ifstream f(dir_ / out / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || j.contains("eval")) continue;
      m[{j["stage"].get<int64_t>(), j["step_in_stage"].get<int64_t>()}] = j["loss"].get<double>();
    }
    return m;
  };
  Result ref = RunTrainer(args(abf, "ref"));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  Result base = RunTrainer(args(plain, "plain"));
  ASSERT_EQ(base.exit_code, 0) << base.err;
  const auto lref = losses("ref"), lplain = losses("plain");
  ASSERT_EQ(lref.size(), 12u);
  ASSERT_EQ(lplain.size(), 12u);
  int differ = 0;
  for (const auto& [key, loss] : lref) {
    if (key.first == 0) EXPECT_EQ(lplain.at(key), loss) << "stage 0 step " << key.second;
    differ += key.first == 1 && lplain.at(key) != loss;
  }
  EXPECT_GT(differ, 0) << "stage 1 trained as if its rope_theta were the model's";

  // The final checkpoint records the stage's RoPE; the export's config.json carries it.
  absl::StatusOr<std::string> final_ckpt =
      ulysses::engine::LatestCommittedCheckpoint((dir_ / "ref" / "checkpoints").string());
  ASSERT_TRUE(final_ckpt.ok()) << final_ckpt.status();
  const json manifest = json::parse(ReadFile(fs::path(*final_ckpt) / "manifest.json"));
  EXPECT_EQ(manifest["extra"]["model_config"]["rope_theta"].get<double>(), 1.0e6)
      << manifest["extra"].dump();
  Result exported = RunTrainer(
      {"export", "--checkpoint", (dir_ / "ref").string(), "--hf-out", (dir_ / "hf").string()});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  const json config = json::parse(ReadFile(dir_ / "hf" / "config.json"));
  EXPECT_EQ(config["rope_theta"].get<double>(), 1.0e6) << config.dump();

  // kill -9 in stage 1 (after its step 3: 4 + 1 eval + 3 lines), then the same command.
  std::vector<std::string> argv = {TrainerBin()};
  for (auto& a : args(abf, "killed")) argv.push_back(a);
  Proc p = Start(argv, "killed", dir_);
  WaitForLines("killed", 8, p);
  kill(-p.pid, SIGKILL);
  Wait(p);
  Result resumed = RunTrainer(args(abf, "killed"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto lkilled = losses("killed");
  ASSERT_EQ(lkilled.size(), 12u);
  for (const auto& [key, loss] : lref) {
    EXPECT_EQ(lkilled.at(key), loss) << "stage " << key.first << " step " << key.second;
  }
}

}  // namespace
