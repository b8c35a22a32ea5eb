// End-to-end tests of the ulysses-train binary: real processes over Gloo on
// loopback, token files on disk, checkpoints on disk.
//   - 20 training steps at sp 1 and sp 4 give the same per-step losses (1e-4 rel);
//     eval of the result at sp 4 equals sp 1.
//   - kill -9 mid-stage, then restart: per-step losses bit-identical to an
//     uninterrupted run (same layout).
//   - SIGTERM -> exit 75 with a committed checkpoint; resuming at another sp
//     degree continues within tolerance of the uninterrupted run.
//   - export -> scripts/reference_llama.py loss == ulysses-train eval --init-from.
//   - bad input: clear message, exit 2, nothing overwritten.
//   - a packed, masked long-document job (data pack -> format: indexed) trains with micro-batches,
//     accumulation and bounded eval, and resumes after kill -9 reading the same sequences, also
//     on another layout (sp/dp/micro-batching): the checkpoint's data cursor says where to go on.
// Checkpoint saves killed mid-write, SIGTERM shorter than a step and the control channel:
// train_e2e_checkpoint_test.cc (same executable). The rig: train_e2e_fixture.h.
#include "tests/worker/engine/train/train_e2e_fixture.h"

namespace {

using namespace ulysses::testing::train_e2e;  // NOLINT: the rig's vocabulary.

TEST_F(TrainE2eTest, Sp4TrainingAndEvalMatchSp1) {
  Result a = RunTrainer(TrainArgs("sp1", {}));
  ASSERT_EQ(a.exit_code, 0) << a.err;
  std::vector<std::string> sp4_args = TrainArgs("sp4", {"spec.parallelism.sp_degree=4"});
  sp4_args.insert(sp4_args.end(), {"--peak-flops", "1e12"});
  Result b = RunTrainer(sp4_args);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  // The step events carry the group figures (slowest of the 4 ranks, median, MFU), and
  // stderr has one human progress line per step with the same figures.
  int with_group = 0;
  std::istringstream events(b.out);
  for (std::string line; std::getline(events, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || j.value("event", "") != "step") continue;
    ASSERT_TRUE(j.contains("slowest_rank") && j.contains("mfu")) << line;
    EXPECT_GE(j["slowest_rank"].get<int>(), 0) << line;
    EXPECT_LT(j["slowest_rank"].get<int>(), 4) << line;
    EXPECT_GE(j["slowest_step_seconds"].get<double>(), j["median_step_seconds"].get<double>());
    EXPECT_GT(j["mfu"].get<double>(), 0.0) << line;
    ++with_group;
  }
  EXPECT_EQ(with_group, 20) << b.out;
  EXPECT_NE(b.err.find("stage 1 step 20/20 seq_len 128 loss "), std::string::npos) << b.err;
  EXPECT_NE(b.err.find("% slowest r"), std::string::npos) << b.err;
  EXPECT_NE(b.err.find("s ago"), std::string::npos) << "checkpoint age after a commit: " << b.err;
  EXPECT_EQ(a.err.find(" mfu "), std::string::npos) << "no MFU without --peak-flops: " << a.err;
  auto la = Losses("sp1"), lb = Losses("sp4");
  ASSERT_EQ(la.size(), 20u);
  ASSERT_EQ(lb.size(), 20u);
  for (auto& [step, loss] : la) {
    EXPECT_NEAR(lb[step], loss, 1e-4 * loss) << "step " << step;
  }
  EXPECT_LT(la[20], la[1]) << "loss did not fall";
  // stdout carries the event contract.
  EXPECT_NE(a.out.find("\"event\":\"step\""), std::string::npos);
  EXPECT_NE(a.out.find("\"event\":\"eval\""), std::string::npos);
  EXPECT_NE(a.out.find("\"event\":\"done\""), std::string::npos);
  // Eval of the sp1 result at sp 4 == sp 1.
  std::string ckpt;
  for (auto& e : fs::directory_iterator(dir_ / "sp1" / "checkpoints"))
    ckpt = std::max(ckpt, e.path().string());
  json e1 = EvalJson(RunTrainer({"eval", "-f", job_, "--checkpoint", ckpt}));
  json e4 = EvalJson(RunTrainer({"eval", "-f", job_, "--checkpoint", ckpt, "--nproc", "4"}));
  EXPECT_EQ(e1["tokens"], e4["tokens"]);
  EXPECT_GT(e1["tokens"].get<int64_t>(), 0);
  EXPECT_NEAR(e1["loss"].get<double>(), e4["loss"].get<double>(), 1e-5 * e1["loss"].get<double>());

  // Reference check: export -> independent PyTorch Llama loss == eval --init-from.
  Result ex = RunTrainer({"export", "--checkpoint", ckpt, "--hf-out", (dir_ / "hf").string()});
  ASSERT_EQ(ex.exit_code, 0) << ex.err;
  Result again = RunTrainer({"export", "--checkpoint", ckpt, "--hf-out", (dir_ / "hf").string()});
  EXPECT_EQ(again.exit_code, 2) << "export must not overwrite";
  json ei = EvalJson(RunTrainer({"eval", "-f", job_, "--init-from", (dir_ / "hf").string()}));
  Result ref_run =
      ::ulysses::testing::RunReferenceLlama((dir_ / "hf").string(), (dir_ / "val.bin").string());
  ASSERT_EQ(ref_run.exit_code, 0) << ref_run.err;
  json ref = json::parse(ref_run.out);
  EXPECT_EQ(ref["tokens"], ei["tokens"]);
  EXPECT_NEAR(ref["loss"].get<double>(), ei["loss"].get<double>(),
              1e-4 * ref["loss"].get<double>());
  EXPECT_NEAR(ei["loss"].get<double>(), e1["loss"].get<double>(), 1e-5 * e1["loss"].get<double>());

  // init_from with a shape its config.json disagrees with: names the field and both values,
  // exit 2.
  Result bad = RunTrainer({"train", "-f", job_, "--out", (dir_ / "bad").string(), "--set",
                           "spec.model.init_from=" + (dir_ / "hf").string(), "--set",
                           "spec.model.intermediate_size=80"});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("spec.model.intermediate_size: 80 disagrees with 96 in " +
                         (dir_ / "hf" / "config.json").string()),
            std::string::npos)
      << bad.err;
}

TEST_F(TrainE2eTest, KillNineAndSigtermResume) {
  const std::vector<std::string> sp2 = {"spec.parallelism.sp_degree=2",
                                        "spec.checkpoint.every_steps=3"};
  Result ref = RunTrainer(TrainArgs("ref", sp2));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  auto lref = Losses("ref");
  ASSERT_EQ(lref.size(), 20u);

  // kill -9 of the whole process tree after step 8 (checkpoint at 6), then restart.
  std::vector<std::string> argv = {TrainerBin()};
  for (auto& a : TrainArgs("killed", sp2)) argv.push_back(a);
  Proc p = Start(argv, "killed", dir_);
  WaitForLines("killed", 8, p);
  kill(-p.pid, SIGKILL);
  Wait(p);
  const int64_t killed_at = LatestCommittedStep("killed");
  ASSERT_GE(killed_at, 6) << "no checkpoint committed before the kill";
  const size_t lines_before_restart = MetricLines("killed");
  Result resumed = RunTrainer(TrainArgs("killed", sp2));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  // The restart trained only the steps after its checkpoint: its first step line is the one
  // after the checkpoint (a restart from step 0 would rewrite steps 1.. with equal losses).
  auto restarted = StepLines("killed", lines_before_restart);
  ASSERT_FALSE(restarted.empty());
  EXPECT_EQ(restarted.begin()->first, killed_at + 1) << "the restart did not resume";
  auto lk = Losses("killed");
  ASSERT_EQ(lk.size(), 20u);
  for (auto& [step, loss] : lref) EXPECT_EQ(lk[step], loss) << "step " << step;  // bit-identical

  // SIGTERM: exit 75 with a committed checkpoint; resume at sp 4 continues within tolerance.
  std::vector<std::string> argv2 = {TrainerBin()};
  for (auto& a : TrainArgs("term", {"spec.parallelism.sp_degree=2"})) argv2.push_back(a);
  Proc t = Start(argv2, "term", dir_);
  WaitForLines("term", 4, t);
  kill(t.pid, SIGTERM);
  ASSERT_EQ(Wait(t), 75) << ReadFile(t.err);
  EXPECT_NE(ReadFile(t.out).find("\"event\":\"checkpoint\""), std::string::npos);
  bool committed = false;
  for (auto& e : fs::directory_iterator(dir_ / "term" / "checkpoints")) {
    committed = committed || fs::exists(e.path() / "manifest.json");
  }
  EXPECT_TRUE(committed);
  const int64_t term_at = LatestCommittedStep("term");
  ASSERT_GE(term_at, 4) << "SIGTERM after step 4 must commit the step it stopped at";
  const size_t term_lines = MetricLines("term");
  Result r4 = RunTrainer(TrainArgs("term", {"spec.parallelism.sp_degree=4"}));
  ASSERT_EQ(r4.exit_code, 0) << r4.err;
  auto term_restarted = StepLines("term", term_lines);
  ASSERT_FALSE(term_restarted.empty());
  EXPECT_EQ(term_restarted.begin()->first, term_at + 1) << "the sp 4 restart did not resume";
  auto lt = Losses("term");
  ASSERT_EQ(lt.size(), 20u);
  for (auto& [step, loss] : lref) EXPECT_NEAR(lt[step], loss, 1e-4 * loss) << "step " << step;

  // A foreign job (other seed) refuses the checkpoint: exit 2, nothing touched.
  auto listing = [&] {
    std::vector<std::string> v;
    for (auto& e : fs::recursive_directory_iterator(dir_ / "term" / "checkpoints")) {
      v.push_back(e.path().string() + ":" +
                  std::to_string(fs::last_write_time(e.path()).time_since_epoch().count()));
    }
    std::sort(v.begin(), v.end());
    return v;
  };
  auto before = listing();
  Result foreign = RunTrainer(TrainArgs("term", {"spec.seed=8"}));
  EXPECT_EQ(foreign.exit_code, 2) << foreign.err;
  EXPECT_NE(foreign.err.find("spec hash"), std::string::npos) << foreign.err;
  EXPECT_EQ(listing(), before);
}

// A packed, masked long-document job (indexed data built by `ulysses-train data pack`, documents
// longer than seq_len, loss masks, micro_batch 2 x grad_accum 2, sp 2, bounded periodic eval)
// trains; kill -9 mid-stage and a restart reads exactly the sequences an uninterrupted run reads
// (bit-identical per-step losses).
TEST_F(TrainE2eTest, PackedMaskedDocumentsTrainAndResumeExactly) {
  WritePackedJob();
  ASSERT_FALSE(HasFatalFailure());
  const std::string prefix = (dir_ / "ds").string();
  // Packing again onto the same prefix is refused: nothing is overwritten.
  Result again =
      RunTrainer({"data", "pack", "--jsonl", (dir_ / "docs.jsonl").string(), "--out", prefix});
  EXPECT_EQ(again.exit_code, 2) << again.err;
  EXPECT_NE(again.err.find("already exists"), std::string::npos) << again.err;

  Result ref = RunTrainer(TrainArgs("ref", {}));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  auto lref = Losses("ref");
  ASSERT_EQ(lref.size(), 8u);
  EXPECT_LT(lref[8], lref[1]);  // it learns
  // Evals at steps 3 and 6 and at the stage end, each over at most 3 sequences.
  std::ifstream metrics(dir_ / "ref" / "metrics.jsonl");
  std::string line;
  int evals = 0;
  while (std::getline(metrics, line)) {
    json j = json::parse(line);
    if (!j.contains("eval")) {
      // 4 sequences of 128 per step; masked prompts, boundaries and padding score fewer.
      EXPECT_LT(j["tokens"].get<int64_t>(), 4 * 128);
      EXPECT_GT(j["tokens"].get<int64_t>(), 0);
      continue;
    }
    ++evals;
    EXPECT_EQ(j["eval"]["step_in_stage"], evals < 3 ? 3 * evals : 8) << line;
    EXPECT_LE(j["eval"]["tokens"].get<int64_t>(), 3 * 127);
    EXPECT_GT(j["eval"]["tokens"].get<int64_t>(), 0);
  }
  EXPECT_EQ(evals, 3);

  std::vector<std::string> argv = {TrainerBin()};
  for (auto& a : TrainArgs("killed", {})) argv.push_back(a);
  Proc p = Start(argv, "killed", dir_);
  WaitForLines("killed", 6, p);  // 5 steps + 1 eval: checkpoint at step 4
  kill(-p.pid, SIGKILL);
  Wait(p);
  Result resumed = RunTrainer(TrainArgs("killed", {}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  auto lk = Losses("killed");
  ASSERT_EQ(lk.size(), 8u);
  for (auto& [step, loss] : lref) EXPECT_EQ(lk[step], loss) << "step " << step;
}

// The data cursor survives layout changes. The packed job (sp 2, micro-batch 2 x grad_accum 2:
// 4 sequences a step) is killed after its step-4 checkpoint, then resumed
//   - at sp 1 x dp 2 with grad_accum 1 (the same 4 sequences a step, cut differently): the
//     losses follow the uninterrupted sp 2 run (fp32, 1e-4 rel), which they cannot if a step
//     read other sequences;
//   - at sp 1 x dp 2 with micro-batch 4 (8 sequences a step): the first resumed step reads on
//     from the checkpoint's cursor (sequence 4k after k steps of 4), not from k x 8.
TEST_F(TrainE2eTest, PackedJobResumesOnAnotherLayoutReadingOnFromTheSameSequence) {
  WritePackedJob();
  ASSERT_FALSE(HasFatalFailure());
  Result ref = RunTrainer(TrainArgs("ref", {}));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  auto lref = Losses("ref");
  ASSERT_EQ(lref.size(), 8u);
  for (auto& [step, cursor] : Cursors("ref")) EXPECT_EQ(cursor, 4 * (step - 1)) << step;

  const std::vector<std::string> dp2 = {"spec.parallelism.sp_degree=1",
                                        "spec.parallelism.dp_degree=2"};
  auto kill_after_checkpoint = [&](const std::string& out) {
    std::vector<std::string> argv = {TrainerBin()};
    // Synchronous saves: the step-5 line then comes after the step-4 commit.
    for (auto& a : TrainArgs(out, {"spec.checkpoint.async=false"})) argv.push_back(a);
    Proc p = Start(argv, out, dir_);
    WaitForLines(out, 6, p);  // 5 steps + the eval at 3: the step-4 checkpoint is committed
    kill(-p.pid, SIGKILL);
    Wait(p);
    return MetricLines(out);
  };
  const size_t before_same = kill_after_checkpoint("same");
  ASSERT_FALSE(HasFatalFailure());
  std::vector<std::string> same = dp2;
  same.push_back("spec.optimizer.grad_accum_steps=1");
  Result r = RunTrainer(TrainArgs("same", same));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto resumed = Losses("same", before_same);
  ASSERT_FALSE(resumed.empty());
  EXPECT_GE(resumed.begin()->first, 5);  // resumed from a checkpoint at step >= 4
  EXPECT_EQ(resumed.rbegin()->first, 8);
  for (auto& [step, loss] : resumed) {
    EXPECT_NEAR(loss, lref[step], 1e-4 * lref[step]) << "step " << step;
  }

  const size_t before_grown = kill_after_checkpoint("grown");
  ASSERT_FALSE(HasFatalFailure());
  std::vector<std::string> grown = dp2;
  grown.push_back("spec.optimizer.micro_batch_size=4");
  grown.push_back("spec.optimizer.grad_accum_steps=1");
  Result g = RunTrainer(TrainArgs("grown", grown));
  ASSERT_EQ(g.exit_code, 0) << g.err;
  auto cursors = Cursors("grown", before_grown);
  ASSERT_FALSE(cursors.empty());
  const int64_t first = cursors.begin()->first;
  EXPECT_GE(first, 5);
  for (auto& [step, cursor] : cursors) {
    EXPECT_EQ(cursor, 4 * (first - 1) + 8 * (step - first)) << "step " << step;
  }
}

// SIGKILL in the middle of a checkpoint save. The checkpoint.before_manifest failpoint
// (common/failpoint.h) holds rank 0 of a 2-rank run inside the save of step 4 after
// every shard is on disk and before manifest.json; the test kills the whole process
// tree as soon as the failpoint's marker file appears (no sleeps), then checks that
// step 2 is still the latest committed checkpoint and loads, that a rerun of the same
// command resumes from it with per-step losses bit-identical to an uninterrupted run,
// and that the rerun re-commits step 4 with the uninterrupted run's tensors.
// --help (or -h) after any command prints the usage on stdout and exits 0.
TEST_F(TrainE2eTest, HelpAfterAnyCommandPrintsTheUsage) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"train", "--help"},
                                               {"eval", "-f", job_, "-h"},
                                               {"export", "--help"},
                                               {"rank", "--help"},
                                               {"data", "pack", "--help"},
                                               {"--help"}}) {
    Result r = RunTrainer(args);
    EXPECT_EQ(r.exit_code, 0) << args[0] << "\n" << r.err;
    EXPECT_NE(r.out.find("usage:\n  ulysses-train train"), std::string::npos) << args[0];
    EXPECT_EQ(r.err.find("unknown flag"), std::string::npos) << args[0] << ": " << r.err;
  }
}

TEST_F(TrainE2eTest, BadInputIsRejectedWithExit2) {
  struct Case {
    std::vector<std::string> sets;
    std::string needle;
  };
  ASSERT_TRUE(WriteLearnableTokens(dir_ / "short.bin", 50, 3));
  const std::vector<Case> cases = {
      {{"spec.parallelism.sp_degree=3"}, "3"},  // seq/heads not divisible
      {{"spec.parallelism.sp_degree=8", "spec.stages[0].seq_len=256"}, "8"},  // 8 > 4 heads
      {{"spec.data.train=" + (dir_ / "short.bin").string()}, "short.bin"},
      {{"spec.model.dtype=float8"}, "float8"},
  };
  for (const auto& c : cases) {
    Result r = RunTrainer(TrainArgs("bad", c.sets));
    EXPECT_EQ(r.exit_code, 2) << c.sets[0] << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(dir_ / "bad" / "checkpoints")) << "a rejected job wrote a checkpoint";
  Result usage = RunTrainer({"train", "--bogus", "1"});
  EXPECT_EQ(usage.exit_code, 2);
  Result nproc = RunTrainer({"train", "-f", job_, "--nproc", "3"});
  EXPECT_EQ(nproc.exit_code, 2);
  EXPECT_NE(nproc.err.find("--nproc"), std::string::npos) << nproc.err;
  Result timeout = RunTrainer(
      {"rank", "-f", job_, "--out", (dir_ / "t").string(), "--collective-timeout-s", "0"});
  EXPECT_EQ(timeout.exit_code, 2);
  EXPECT_NE(timeout.err.find("--collective-timeout-s: 0 is outside 1..86400"), std::string::npos)
      << timeout.err;
  for (const char* command : {"rank", "train"}) {
    Result threads = RunTrainer(
        {command, "-f", job_, "--out", (dir_ / "t").string(), "--intra-op-threads", "-1"});
    EXPECT_EQ(threads.exit_code, 2) << command;
    EXPECT_NE(threads.err.find("--intra-op-threads: -1 is outside 0..1024"), std::string::npos)
        << command << ": " << threads.err;
  }
  // A corrupt checkpoint is refused by eval and export.
  Result ok = RunTrainer(TrainArgs("c", {"spec.stages[0].steps=2"}));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  std::string ckpt;
  for (auto& e : fs::directory_iterator(dir_ / "c" / "checkpoints")) ckpt = e.path().string();
  // Eval reads only the model's tensors (not the optimizer state), so the garbage goes inside
  // one of them: the first model tensor the manifest lists, at its recorded byte offset.
  json manifest = json::parse(ReadFile((fs::path(ckpt) / "manifest.json").string()));
  bool corrupted = false;
  for (const json& t : manifest["tensors"]) {
    if (t["name"].get<std::string>().rfind("model/", 0) != 0) continue;
    const fs::path shard =
        fs::path(ckpt) / manifest["shards"][t["shard"].get<size_t>()]["file"].get<std::string>();
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(t["offset"].get<int64_t>()));
    f.write("garbage!", 8);
    corrupted = f.good();
    break;
  }
  ASSERT_TRUE(corrupted) << manifest.dump();
  Result ev = RunTrainer({"eval", "-f", job_, "--checkpoint", ckpt});
  EXPECT_EQ(ev.exit_code, 2) << ev.err;
  EXPECT_FALSE(ev.err.empty());
}

}  // namespace
