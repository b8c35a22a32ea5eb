// Output of the coordinator-facing ulyssesctl verbs: the -o json contract, error
// lines, and the non-TTY watch view. The verbs against a live coordinator are
// covered by tests/e2e.
#include "client/job_view.h"

#include <sstream>

#include "client/cli.h"
#include "client/grpc_client.h"
#include "gtest/gtest.h"

namespace ulysses::client {
namespace {

namespace v1 = ::ulysses::v1;

v1::Job SampleJob() {
  v1::Job job;
  job.set_id("job-000007");
  job.set_name("tiny-demo");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_reason("stage 2/3 running");
  job.set_stage_index(1);
  job.set_restarts(1);
  job.set_preemptions(2);
  job.set_loss(3.5);
  for (int i = 0; i < 3; ++i) {
    auto* s = job.add_stages();
    s->set_index(i);
    s->set_seq_len(1024 << i);
    s->set_steps(10);
    if (i < 2) s->mutable_progress()->set_step(i == 1 ? 4 : 10);
    s->set_sp(1 << i);
    s->set_dp(1);
  }
  job.mutable_last_checkpoint()->set_path("/ck/job-000007/stage1-step4");
  job.mutable_last_checkpoint()->set_stage(1);
  job.mutable_last_checkpoint()->set_step(4);
  auto* a = job.add_attempts();
  a->set_generation(3);
  a->set_stage(1);
  a->add_worker_ids("w-a");
  a->add_worker_ids("w-b");
  a->set_outcome(v1::ATTEMPT_OUTCOME_LOST);
  return job;
}

TEST(JobViewTest, SummaryJsonHasTheContractFields) {
  nlohmann::json j = JobSummaryJson(SampleJob());
  for (const char* key : {"id", "name", "state", "reason", "stage", "seq_len", "step", "restarts",
                          "preemptions", "last_checkpoint", "loss"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["id"], "job-000007");
  EXPECT_EQ(j["state"], "RUNNING");
  // Stage numbers a person reads are 1-based (docs/CONTRACTS.md "Stage numbers"): the
  // proto's stage index 1 is the second stage.
  EXPECT_EQ(j["stage"], 2);
  EXPECT_EQ(j["seq_len"], 2048);
  EXPECT_EQ(j["step"], 4);
  EXPECT_EQ(j["restarts"], 1);
  EXPECT_EQ(j["preemptions"], 2);
  EXPECT_EQ(j["last_checkpoint"]["step"], 4);
  EXPECT_DOUBLE_EQ(j["loss"].get<double>(), 3.5);

  v1::Job fresh;
  fresh.set_id("job-000008");
  nlohmann::json k = JobSummaryJson(fresh);
  EXPECT_TRUE(k["last_checkpoint"].is_null());
  EXPECT_EQ(k["state"], "UNSPECIFIED");
}

TEST(JobViewTest, DetailJsonHasStagesAttemptsAndCheckpoints) {
  v1::Job job = SampleJob();
  auto* e = job.add_events();
  e->mutable_checkpoint()->set_path("/ck/x");
  e->mutable_checkpoint()->set_step(2);
  auto* change = job.add_events()->mutable_state_change();
  change->set_from(v1::JOB_STATE_RUNNING);
  change->set_to(v1::JOB_STATE_RECOVERING);
  change->set_reason("worker w-b lost");
  nlohmann::json j = JobDetailJson(job);
  ASSERT_EQ(j["stages"].size(), 3u);
  EXPECT_EQ(j["stages"][2]["world_size"], 4);
  EXPECT_EQ(j["stages"][0]["state"], "UNSPECIFIED");
  EXPECT_EQ(j["stages"][0]["stage"], 1);
  EXPECT_EQ(j["stages"][2]["stage"], 3);
  ASSERT_EQ(j["attempts"].size(), 1u);
  EXPECT_EQ(j["attempts"][0]["world_size"], 2);
  EXPECT_EQ(j["attempts"][0]["outcome"], "LOST");
  ASSERT_EQ(j["checkpoints"].size(), 1u);
  EXPECT_EQ(j["checkpoints"][0]["path"], "/ck/x");
  ASSERT_EQ(j["events"].size(), 2u);
  EXPECT_EQ(j["events"][1]["to"], "RECOVERING");
  EXPECT_EQ(j["events"][1]["reason"], "worker w-b lost");
}

TEST(JobViewTest, DescriptionAndTablesNameTheJob) {
  std::ostringstream out;
  v1::Job job = SampleJob();
  v1::Goodput* g = job.mutable_goodput();
  g->set_allocated_gpu_seconds(200);
  g->set_productive_gpu_seconds(150);
  g->set_lost_failure_gpu_seconds(30);
  g->set_lost_preemption_gpu_seconds(12);
  g->set_lost_restart_gpu_seconds(4);
  g->set_lost_checkpoint_stall_gpu_seconds(2);
  g->set_uncommitted_gpu_seconds(2);
  g->set_ratio(0.75);
  PrintJobDescription(job, out);
  EXPECT_NE(out.str().find("job-000007 (tiny-demo)"), std::string::npos);
  EXPECT_NE(out.str().find("LOST"), std::string::npos);
  EXPECT_NE(out.str().find("Goodput:      75.0% of 200.0 GPU-s productive; lost: failure 30.0, "
                           "preemption 12.0, restart 4.0, checkpoint_stall 2.0, cancelled 0.0; "
                           "uncommitted 2.0"),
            std::string::npos)
      << out.str();
  const nlohmann::json j = JobSummaryJson(job);
  EXPECT_DOUBLE_EQ(j["goodput"]["ratio"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j["goodput"]["lost_gpu_seconds"]["preemption"].get<double>(), 12);
  std::ostringstream none;
  PrintJobDescription(SampleJob(), none);  // Nothing allocated yet.
  EXPECT_NE(none.str().find("Goodput:      -\n"), std::string::npos) << none.str();
  std::ostringstream table;
  PrintJobsTable({SampleJob()}, table);
  EXPECT_NE(table.str().find("2/3"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("4/10"), std::string::npos) << table.str();
}

// every_steps: auto: describe shows the interval the coordinator chose and why (T, C, MTBF and
// their sources), in text and JSON; a job without one shows no such line.
TEST(JobViewTest, DescribeShowsTheAutoCheckpointIntervalAndWhy) {
  v1::Job job = SampleJob();
  v1::CheckpointInterval* i = job.mutable_checkpoint_interval();
  i->set_version(3);
  i->set_every_steps(671);
  i->set_interval_seconds(1341.6);
  i->set_cost_seconds(0.5);
  i->set_cost_source("measured");
  i->set_mtbf_seconds(1.8e6);
  i->set_mtbf_source("prior");
  i->set_step_seconds(2);
  i->set_group_gpus(2);
  i->set_reason("auto: every 671 steps");
  std::ostringstream out;
  PrintJobDescription(job, out);
  EXPECT_NE(out.str().find("Ckpt every:   every 671 step(s) (auto, version 3)\n"
                           "  why:        T = sqrt(2 x C x MTBF) = 1341.6 s; C 0.500 s (measured); "
                           "MTBF 1800000 s for 2 GPU(s) (prior); step 2.000 s\n"),
            std::string::npos)
      << out.str();
  const nlohmann::json j = JobDetailJson(job)["checkpoint_interval"];
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["every_steps"], 671);
  EXPECT_EQ(j["cost_source"], "measured");
  EXPECT_EQ(j["mtbf_source"], "prior");
  EXPECT_DOUBLE_EQ(j["mtbf_seconds"].get<double>(), 1.8e6);
  EXPECT_EQ(j["reason"], "auto: every 671 steps");
  // Before a cost is measured: every step, and why.
  i->set_cost_source("none");
  i->set_every_steps(1);
  std::ostringstream first;
  PrintJobDescription(job, first);
  EXPECT_NE(first.str().find("C not measured yet: every step until the first checkpoint"),
            std::string::npos)
      << first.str();
  std::ostringstream plain;
  PrintJobDescription(SampleJob(), plain);
  EXPECT_EQ(plain.str().find("Ckpt every:"), std::string::npos) << plain.str();
  EXPECT_FALSE(JobDetailJson(SampleJob()).contains("checkpoint_interval"));
}

// describe shows what the job trains on from the spec GetJob returns (include_spec): data,
// batch (micro-batch x accumulation x dp per stage) and evaluation bounds, per stage too.
TEST(JobViewTest, DescribeShowsDataBatchAndEvalFromTheSpec) {
  v1::Job job = SampleJob();
  job.set_spec_yaml(
      "apiVersion: ulysses/v1\nkind: TrainJob\nmetadata: {name: sft}\nspec:\n"
      "  model: {preset: tiny}\n"
      "  data: {train: /data/sft, validation: /data/sft-val, format: indexed}\n"
      "  optimizer: {micro_batch_size: 2, grad_accum_steps: 4}\n"
      "  eval: {max_sequences: 64, every_steps: 200}\n"
      "  stages:\n"
      "    - {seq_len: 1024, steps: 10}\n"
      "    - {seq_len: 2048, steps: 10, dp_degree: 2}\n"
      "    - {seq_len: 4096, steps: 10, eval: {max_sequences: 8, every_steps: 0}}\n");
  nlohmann::json j = JobDetailJson(job);
  EXPECT_EQ(j["data"]["format"], "indexed");
  EXPECT_EQ(j["data"]["train"], "/data/sft");
  EXPECT_EQ(j["data"]["packing"], true);
  EXPECT_EQ(j["batch"]["micro_batch_size"], 2);
  EXPECT_EQ(j["batch"]["grad_accum_steps"], 4);
  EXPECT_EQ(j["eval"]["every_steps"], 200);
  EXPECT_EQ(j["stages"][0]["global_batch"], 8);
  EXPECT_EQ(j["stages"][1]["global_batch"], 16);
  EXPECT_EQ(j["stages"][2]["eval_spec"]["max_sequences"], 8);
  EXPECT_EQ(j["stages"][2]["eval_spec"]["every_steps"], 0);
  std::ostringstream out;
  PrintJobDescription(job, out);
  const std::string text = out.str();
  EXPECT_NE(text.find("Data:         indexed /data/sft (validation /data/sft-val), documents "
                      "packed"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("micro_batch_size 2 x grad_accum_steps 4"), std::string::npos) << text;
  EXPECT_NE(text.find("Eval:         every 200 steps and at the stage end, at most 64 validation"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("stage 3:     at the stage end, at most 8 validation"), std::string::npos)
      << text;
  // Without a spec (an older coordinator) the description still prints, without those lines.
  std::ostringstream plain;
  PrintJobDescription(SampleJob(), plain);
  EXPECT_EQ(plain.str().find("Data:"), std::string::npos);
  EXPECT_FALSE(JobDetailJson(SampleJob()).contains("data"));
}

TEST(JobViewTest, DescribeShowsFailureBudgetsByKind) {
  v1::Job job = SampleJob();
  job.set_failures(4);
  job.set_infra_failures(9);
  job.set_max_failures(3);
  job.set_max_infra_failures(20);
  job.set_counting_failures(1);
  job.set_counting_infra_failures(2);
  job.set_failure_window_s(3600);
  job.set_preemptible(false);
  std::ostringstream out;
  PrintJobDescription(job, out);
  EXPECT_NE(out.str().find("Failures: 4 application, 9 infrastructure"), std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find("Budgets:      1 of max_failures 3, 2 of max_infra_failures 20 "
                           "counting (since the last new checkpoint, within 3600s); not "
                           "preemptible"),
            std::string::npos)
      << out.str();
  nlohmann::json j = JobDetailJson(job);
  EXPECT_EQ(j["infra_failures"], 9);
  EXPECT_EQ(j["max_infra_failures"], 20);
  EXPECT_EQ(j["counting_infra_failures"], 2);
  EXPECT_EQ(j["failure_window_s"], 3600);
  EXPECT_EQ(j["preemptible"], false);
}

TEST(JobViewTest, PlainWatchViewPrintsOneLinePerProgressAndTheEnd) {
  std::ostringstream out;
  WatchView view(out, /*tty=*/false);
  v1::JobEvent snap;
  *snap.mutable_snapshot() = SampleJob();
  view.OnEvent(snap);
  v1::JobEvent progress;
  progress.mutable_progress()->set_stage(1);
  progress.mutable_progress()->set_step(5);
  progress.mutable_progress()->set_steps(10);
  progress.mutable_progress()->set_loss(3.25);
  progress.mutable_progress()->set_tokens_per_s(1500);
  view.OnEvent(progress);
  v1::JobEvent done;
  done.mutable_state_change()->set_from(v1::JOB_STATE_RUNNING);
  done.mutable_state_change()->set_to(v1::JOB_STATE_FAILED);
  done.mutable_state_change()->set_reason("max_failures exhausted");
  view.OnEvent(done);
  EXPECT_EQ(view.Finish(), v1::JOB_STATE_FAILED);
  const std::string text = out.str();
  EXPECT_NE(text.find("stage 2/3 seq   2048 sp 2 step 5/10 loss 3.2500 tok/s 1500"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("\033["), std::string::npos) << "no escape codes when not a TTY";
  EXPECT_NE(text.find("RUNNING -> FAILED: max_failures exhausted"), std::string::npos) << text;
  EXPECT_NE(text.find("job-000007 finished: FAILED"), std::string::npos) << text;
}

// A job the cluster is too small for: watch warns with the condition from the snapshot,
// prints the reason it waits for as it changes and the condition's clearing; describe and
// the JSON carry the condition, its stage counted from 1.
TEST(JobViewTest, WatchAndDescribeShowTheUnschedulableConditionAndTheWaitingReason) {
  v1::Job job = SampleJob();
  v1::JobCondition* c = job.add_conditions();
  c->set_type("Unschedulable");
  c->set_status(true);
  c->set_reason("ClusterTooSmall");
  c->set_stage(2);
  c->set_message("stage 3 of 3 needs 4 slots (sp 4 x dp 1); the registered workers have 2 slots");
  std::ostringstream described;
  PrintJobDescription(job, described);
  EXPECT_NE(described.str().find("Condition:    Unschedulable (ClusterTooSmall): stage 3 of 3 "
                                 "needs 4 slots"),
            std::string::npos)
      << described.str();
  const nlohmann::json j = JobDetailJson(job);
  ASSERT_EQ(j["conditions"].size(), 1u) << j.dump();
  EXPECT_EQ(j["conditions"][0]["stage"], 3);
  EXPECT_EQ(j["conditions"][0]["type"], "Unschedulable");

  std::ostringstream out;
  WatchView view(out, /*tty=*/false);
  v1::JobEvent snap;
  *snap.mutable_snapshot() = job;
  view.OnEvent(snap);
  v1::JobEvent waiting;
  waiting.set_reason("stage 2 of 3: needs 2 free slots, 1 available");
  view.OnEvent(waiting);
  v1::JobEvent cleared;
  *cleared.mutable_condition() = *c;
  cleared.mutable_condition()->set_status(false);
  view.OnEvent(cleared);
  const std::string text = out.str();
  EXPECT_NE(text.find("warning: Unschedulable (ClusterTooSmall): stage 3 of 3 needs 4 slots"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("waiting: stage 2 of 3: needs 2 free slots, 1 available"), std::string::npos)
      << text;
  EXPECT_NE(text.find("Unschedulable: no longer holds"), std::string::npos) << text;
}

// `top`: one row per job not yet ended, with the current stage's live figures; "-" (JSON:
// null) where a figure is unknown; the checkpoint age from committed_at to "now".
TEST(TopViewTest, RowsShowLiveFiguresOfJobsNotYetEnded) {
  v1::Job running = SampleJob();
  v1::StepProgress* p = running.mutable_stages(1)->mutable_progress();
  p->set_loss(2.5);
  p->set_tokens_per_s(1234.4);
  p->set_mfu(0.25);
  p->set_step_seconds(0.5);
  p->set_median_step_seconds(0.5);
  p->set_slowest_rank(1);
  p->set_slowest_step_seconds(0.75);
  running.mutable_last_checkpoint()->mutable_committed_at()->set_seconds(1'700'000'000);
  running.mutable_goodput()->set_allocated_gpu_seconds(400);
  running.mutable_goodput()->set_productive_gpu_seconds(300);
  running.mutable_goodput()->set_ratio(0.75);
  v1::Job queued;
  queued.set_id("job-000008");
  queued.set_name("waiting");
  queued.set_state(v1::JOB_STATE_PENDING);
  queued.add_stages()->set_seq_len(512);
  queued.mutable_stages(0)->set_steps(3);
  v1::Job done = SampleJob();
  done.set_id("job-000006");
  done.set_state(v1::JOB_STATE_SUCCEEDED);
  const int64_t now_ms = 1'700'000'065'400;  // 65.4 s after the checkpoint.

  const auto rows = TopTable({done, running, queued}, now_ms);
  ASSERT_EQ(rows.size(), 3u) << "header, the running and the queued job; not the ended one";
  EXPECT_EQ(rows[0],
            (std::vector<std::string>{"JOB", "NAME", "STATE", "STAGE", "SEQ_LEN", "STEP", "LOSS",
                                      "TOK/S", "MFU", "SLOWEST", "CKPT_AGE", "GOODPUT"}));
  EXPECT_EQ(rows[1],
            (std::vector<std::string>{"job-000007", "tiny-demo", "RUNNING", "2/3", "2048", "4/10",
                                      "2.5000", "1234", "25.0%", "r1 0.750s", "1m05s", "75.0%"}));
  EXPECT_EQ(rows[2], (std::vector<std::string>{"job-000008", "waiting", "PENDING", "1/1", "512",
                                               "0/3", "-", "-", "-", "-", "-", "-"}));
  // --all: the ended job too, in the given order.
  const auto all = TopTable({done, running, queued}, now_ms, /*include_ended=*/true);
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[1][0], "job-000006");
  EXPECT_EQ(all[1][2], "SUCCEEDED");
  EXPECT_EQ(TopJson({done}, now_ms, /*include_ended=*/true).size(), 1u);

  const nlohmann::json j = TopJson({done, running, queued}, now_ms);
  ASSERT_EQ(j.size(), 2u) << j.dump();
  EXPECT_EQ(j[0]["id"], "job-000007");
  EXPECT_EQ(j[0]["step"], 4);
  EXPECT_DOUBLE_EQ(j[0]["mfu"].get<double>(), 0.25);
  EXPECT_EQ(j[0]["slowest_rank"], 1);
  EXPECT_DOUBLE_EQ(j[0]["slowest_step_seconds"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j[0]["median_step_seconds"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j[0]["checkpoint_age_seconds"].get<double>(), 65.4);
  EXPECT_DOUBLE_EQ(j[0]["goodput_ratio"].get<double>(), 0.75);
  EXPECT_EQ(j[1]["id"], "job-000008");
  for (const char* key : {"mfu", "step_seconds", "median_step_seconds", "slowest_rank",
                          "slowest_step_seconds", "checkpoint_age_seconds", "goodput_ratio"}) {
    ASSERT_TRUE(j[1].contains(key)) << key;
    EXPECT_TRUE(j[1][key].is_null()) << key << ": " << j[1][key];
  }
}

// CKPT_AGE of a running job is the coordinator's work at risk (work_at_risk_since, the clock of
// ulysses_checkpoint_age_seconds): after a restart it counts from the attempt's start, not from
// the older commit the attempt resumed from.
TEST(TopViewTest, CheckpointAgeOfARunningJobIsTheCoordinatorsWorkAtRisk) {
  v1::Job running = SampleJob();
  running.mutable_last_checkpoint()->mutable_committed_at()->set_seconds(1'700'000'000);
  running.mutable_work_at_risk_since()->set_seconds(1'700'000'050);  // the restart
  const int64_t now_ms = 1'700'000'065'400;
  const auto rows = TopTable({running}, now_ms);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1][10], "15s") << "15.4 s since the attempt started, not 65.4 s";
  EXPECT_DOUBLE_EQ(TopJson({running}, now_ms)[0]["checkpoint_age_seconds"].get<double>(), 15.4);
}

// `top` names an unreachable coordinator (exit 1) and refuses an interval out of range (2).
TEST(TopViewTest, TopAgainstNoCoordinatorExitsOneNamingIt) {
  std::ostringstream out, err;
  const char* argv[] = {"ulyssesctl", "--coordinator", "127.0.0.1:1", "top", "--once"};
  EXPECT_EQ(RunCli(5, argv, out, err), 1);
  EXPECT_NE(err.str().find("cannot reach the coordinator at 127.0.0.1:1"), std::string::npos)
      << err.str();
  const char* bad[] = {"ulyssesctl", "--coordinator", "127.0.0.1:1", "top", "--interval", "0.1"};
  std::ostringstream out2, err2;
  EXPECT_EQ(RunCli(6, bad, out2, err2), 2) << err2.str();
  EXPECT_NE(err2.str().find("--interval"), std::string::npos) << err2.str();
}

TEST(JobViewTest, RpcErrorsAreOneLineWithCodeOrAddress) {
  EXPECT_EQ(FormatRpcError(absl::NotFoundError("job job-9 not found"), "h:1"),
            "error: NOT_FOUND: job job-9 not found");
  const std::string down = FormatRpcError(absl::UnavailableError("connection refused"), "h:1");
  EXPECT_EQ(down, "error: cannot reach the coordinator at h:1 (UNAVAILABLE: connection refused)");
}

TEST(JobViewTest, UnreachableCoordinatorIsNamedAndExitsOne) {
  std::ostringstream out, err;
  const char* argv[] = {"ulyssesctl", "--coordinator", "127.0.0.1:1", "get", "jobs"};
  EXPECT_EQ(RunCli(5, argv, out, err), 1);
  EXPECT_NE(err.str().find("cannot reach the coordinator at 127.0.0.1:1"), std::string::npos)
      << err.str();
  EXPECT_EQ(err.str().find('\n'), err.str().size() - 1) << "one line";
}

TEST(JobViewTest, SubmitRejectsABadSpecLocally) {
  std::ostringstream out, err;
  const std::string spec =
      std::string(std::getenv("ULYSSES_SOURCE_DIR")) + "/configs/jobs/tiny-demo.yaml";
  const char* argv[] = {
      "ulyssesctl", "--coordinator", "127.0.0.1:1", "submit",
      "-f",         spec.c_str(),    "--set",       "spec.stages[1].seq_len=2047"};
  EXPECT_EQ(RunCli(8, argv, out, err), 2);  // Bad input.
  // The validation message, not a connection error: nothing was sent.
  EXPECT_NE(err.str().find("spec.stages[1].seq_len"), std::string::npos) << err.str();
  EXPECT_EQ(err.str().find("cannot reach"), std::string::npos) << err.str();
  EXPECT_TRUE(out.str().empty());
}

TEST(WorkersViewTest, DrainingWorkersAreMarked) {
  v1::Worker idle, draining;
  idle.set_name("gpu-0");
  idle.set_state(v1::WORKER_STATE_IDLE);
  draining.set_name("gpu-1");
  draining.set_state(v1::WORKER_STATE_BUSY);
  draining.set_draining(true);
  draining.mutable_running()->mutable_ref()->set_job_id("job-000003");
  EXPECT_EQ(WorkerStateLabel(idle), "IDLE");
  EXPECT_EQ(WorkerStateLabel(draining), "BUSY,DRAINING");
  EXPECT_EQ(WorkerJson(idle)["draining"], false);
  EXPECT_EQ(WorkerJson(draining)["draining"], true);
  EXPECT_EQ(WorkerJson(draining)["state"], "BUSY");
  std::ostringstream out;
  PrintWorkersTable({idle, draining}, out);
  const std::string table = out.str();
  EXPECT_NE(table.find("BUSY,DRAINING"), std::string::npos) << table;
  EXPECT_EQ(table.find("IDLE,DRAINING"), std::string::npos) << table;
}

}  // namespace
}  // namespace ulysses::client
