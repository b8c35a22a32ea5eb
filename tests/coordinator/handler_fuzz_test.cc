// gRPC-handler fuzz test: random but well-formed protos (every field filled by
// reflection with edge values: NaN/inf, int extremes, huge and hostile strings, known
// job ids and live WorkRefs) for every JobService RPC, Register, and every Session
// message kind, through the real gRPC API of an in-process coordinator. Afterwards the
// coordinator must still be up, SERVING, answer every read, and its state consistent:
// an honest worker runs a fresh job to SUCCEEDED and the store reloads it the same.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/reflection.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/grpc_util.h"
#include "common/spec/path_confine.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_worker.h"
#include "tests/coordinator/grpc_fixture.h"
#include "tests/coordinator/test_util.h"

namespace ulysses::coordinator {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using testing::FakeWorker;
using testing::JobYaml;

// Fills messages with values chosen to hit edges and, often enough, real state.
class ProtoFuzzer {
 public:
  explicit ProtoFuzzer(uint64_t seed) : rng_(seed) {}

  // Strings the coordinator knows (job ids, worker names), mixed into the pool.
  std::vector<std::string> known;
  // A WorkRef that names live work, used for WorkRef fields half the time.
  v1::WorkRef live_ref;

  void Fill(Message* m, int depth) {
    const auto* d = m->GetDescriptor();
    const Reflection* r = m->GetReflection();
    if (d->full_name() == "ulysses.v1.WorkRef" && Chance(2)) {
      m->CopyFrom(live_ref);
      if (Chance(3)) r->SetInt32(m, d->FindFieldByName("rank"), static_cast<int32_t>(Int()));
      return;
    }
    // One member of each oneof (a message of every kind is built by the caller).
    for (int i = 0; i < d->oneof_decl_count(); ++i) {
      const auto* oneof = d->oneof_decl(i);
      if (depth > 0 && !Chance(2)) continue;
      FillField(m, oneof->field(Pick(oneof->field_count())), depth);
    }
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (f->containing_oneof() != nullptr || Chance(4)) continue;
      FillField(m, f, depth);
    }
  }

  void FillField(Message* m, const FieldDescriptor* f, int depth) {
    const Reflection* r = m->GetReflection();
    int n = f->is_repeated() ? Pick(4) : 1;
    for (int k = 0; k < n; ++k) {
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_MESSAGE:
          if (depth >= 4) return;
          Fill(f->is_repeated() ? r->AddMessage(m, f) : r->MutableMessage(m, f), depth + 1);
          break;
        case FieldDescriptor::CPPTYPE_STRING:
          f->is_repeated() ? r->AddString(m, f, Str()) : r->SetString(m, f, Str());
          break;
        case FieldDescriptor::CPPTYPE_INT32: {
          auto v = static_cast<int32_t>(Int());
          f->is_repeated() ? r->AddInt32(m, f, v) : r->SetInt32(m, f, v);
          break;
        }
        case FieldDescriptor::CPPTYPE_INT64:
          f->is_repeated() ? r->AddInt64(m, f, Int()) : r->SetInt64(m, f, Int());
          break;
        case FieldDescriptor::CPPTYPE_UINT32: {
          auto v = static_cast<uint32_t>(Int());
          f->is_repeated() ? r->AddUInt32(m, f, v) : r->SetUInt32(m, f, v);
          break;
        }
        case FieldDescriptor::CPPTYPE_UINT64: {
          auto v = static_cast<uint64_t>(Int());
          f->is_repeated() ? r->AddUInt64(m, f, v) : r->SetUInt64(m, f, v);
          break;
        }
        case FieldDescriptor::CPPTYPE_DOUBLE:
          f->is_repeated() ? r->AddDouble(m, f, Dbl()) : r->SetDouble(m, f, Dbl());
          break;
        case FieldDescriptor::CPPTYPE_FLOAT: {
          auto v = static_cast<float>(Dbl());
          f->is_repeated() ? r->AddFloat(m, f, v) : r->SetFloat(m, f, v);
          break;
        }
        case FieldDescriptor::CPPTYPE_BOOL:
          f->is_repeated() ? r->AddBool(m, f, Chance(2)) : r->SetBool(m, f, Chance(2));
          break;
        case FieldDescriptor::CPPTYPE_ENUM: {
          // Mostly defined values, sometimes an unknown number (proto3 keeps it).
          const auto* e = f->enum_type();
          int v = Chance(5) ? static_cast<int>(Int() % 1000)
                            : e->value(Pick(e->value_count()))->number();
          f->is_repeated() ? r->AddEnumValue(m, f, v) : r->SetEnumValue(m, f, v);
          break;
        }
      }
    }
  }

  bool Chance(int one_in) { return Pick(one_in) == 0; }
  int Pick(int n) { return n <= 1 ? 0 : static_cast<int>(rng_() % static_cast<uint64_t>(n)); }

  int64_t Int() {
    static const int64_t kEdges[] = {0,
                                     1,
                                     -1,
                                     2,
                                     75,
                                     255,
                                     256,
                                     std::numeric_limits<int32_t>::max(),
                                     std::numeric_limits<int32_t>::min(),
                                     int64_t{1} << 31,
                                     std::numeric_limits<int64_t>::max(),
                                     std::numeric_limits<int64_t>::min(),
                                     1000000000000000};
    if (Chance(2)) return kEdges[Pick(sizeof(kEdges) / sizeof(kEdges[0]))];
    return static_cast<int64_t>(rng_() % 2000) - 500;
  }

  double Dbl() {
    static const double kEdges[] = {std::nan(""),
                                    std::numeric_limits<double>::infinity(),
                                    -std::numeric_limits<double>::infinity(),
                                    0.0,
                                    -0.0,
                                    1e300,
                                    -1e300,
                                    7.5,
                                    0.5,
                                    std::numeric_limits<double>::denorm_min()};
    if (Chance(2)) return kEdges[Pick(sizeof(kEdges) / sizeof(kEdges[0]))];
    return std::uniform_real_distribution<double>(-10, 10)(rng_);
  }

  std::string Str() {
    switch (Pick(9)) {
      case 0:
        return "";
      case 1:
        return std::string(Pick(3) == 0 ? 300000 : 5000, 'x');
      case 2:
        return "../../../../root/.ssh/id_rsa";
      case 3:
        return std::string("nul\0byte", 8);
      case 4:
        return "\xc3\xbcn\xc3\xaf\xf0\x9f\x98\x80 \u2028 \r\n\x1b[31m";  // Valid UTF-8 (proto3).
      case 5:
        return "/etc/shadow";
      case 6:
        return "UPPER_case.name";
      default:
        return known.empty() ? "w1" : known[Pick(static_cast<int>(known.size()))];
    }
  }

 private:
  std::mt19937_64 rng_;
};

class HandlerFuzzTest : public testing::CoordinatorServerTest {
 protected:
  template <typename Req, typename Resp, typename Call>
  void Unary(ProtoFuzzer& fz, Call call) {
    Req req;
    fz.Fill(&req, 0);
    Resp resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    grpc::Status s = call(&ctx, req, &resp);
    // Any answer is fine; a crash or a hang is not. A deadline would mean a stuck lock.
    EXPECT_NE(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
    ++codes_[s.error_code()];
    if (s.ok() && std::is_same<Resp, v1::SubmitJobResponse>::value) ++accepted_submits_;
  }

  template <typename Req, typename Item, typename Call>
  void Stream(ProtoFuzzer& fz, Call call) {
    Req req;
    fz.Fill(&req, 0);
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Milliseconds(300));  // Follow streams end by deadline.
    auto reader = call(&ctx, req);
    Item item;
    for (int i = 0; i < 3 && reader->Read(&item); ++i) {
    }
    ctx.TryCancel();
    grpc::Status s = reader->Finish();
    EXPECT_NE(s.error_code(), grpc::StatusCode::UNKNOWN) << s.error_message();
  }

  int accepted_submits_ = 0;
  std::map<int, int> codes_;  // Unary answers by gRPC code.
};

TEST_F(HandlerFuzzTest, RandomProtosForEveryRpcAndMessageKindLeaveTheCoordinatorConsistent) {
  FakeWorker& honest = AddWorker("honest");
  // Not preemptible: a fuzzed job of higher priority would rightly preempt it.
  auto target =
      Submit(JobYaml("target", "    - {seq_len: 256, steps: 60}\n", "{preemptible: false}"));
  ASSERT_TRUE(target.ok()) << target.status();
  auto a = honest.WaitAssignment();
  ASSERT_TRUE(a.has_value());
  honest.Started(a->ref());
  ASSERT_TRUE(WaitState(*target, v1::JOB_STATE_RUNNING));

  FakeWorker& fuzzer_worker = AddWorker("fuzzer");
  auto workers = v1::WorkerService::NewStub(channel_);
  ProtoFuzzer fz(/*seed=*/20261123);
  fz.known = {*target, "honest", "fuzzer", "w-honest", "job-000002", "target"};
  fz.live_ref = a->ref();

  // Paths the confinement must refuse (or, the last ones, take as plain data).
  const std::string root = config_.checkpoint_root;
  std::filesystem::create_directories(root);
  std::filesystem::create_symlink("/nonexistent-fuzz-target", root + "/dangling");
  const std::vector<std::string> hostile_paths = {
      root + "/x #y",  root + "/x\\n",     root + "/x\\x1b[2J",  " " + root + "/x",
      root + "/x ",    root + "/x\\0y",    root + "/dangling/x", root + "/../../etc",
      root + "/x\\ty", root + "/a: b [c]", root + "/fine"};
  const auto* kinds = v1::WorkerMessage::descriptor()->FindOneofByName("kind");
  ASSERT_NE(kinds, nullptr);
  constexpr int kRounds = 3000;
  for (int round = 0; round < kRounds; ++round) {
    switch (round % 10) {
      case 0:
        Unary<v1::SubmitJobRequest, v1::SubmitJobResponse>(fz, [&](auto* c, auto& q, auto* p) {
          // A valid document with hostile overrides, one naming a hostile checkpoint dir
          // or data path (YAML escapes: the parsed string holds the raw bytes), or random text.
          const int shape = fz.Pick(3);
          if (shape > 0) q.set_spec_yaml(JobYaml("fuzzed", "    - {seq_len: 64, steps: 1}\n"));
          if (shape == 2) {
            const std::string path = hostile_paths[fz.Pick(static_cast<int>(hostile_paths.size()))];
            q.set_spec_yaml(q.spec_yaml() +
                            (fz.Chance(2) ? "  checkpoint: {dir: \"" + path + "\"}\n" : ""));
            if (fz.Chance(2)) q.add_overrides("spec.checkpoint.dir=" + path);
          }
          return jobs_->SubmitJob(c, q, p);
        });
        break;
      case 1:
        Unary<v1::GetJobRequest, v1::GetJobResponse>(
            fz, [&](auto* c, auto& q, auto* p) { return jobs_->GetJob(c, q, p); });
        break;
      case 2:
        Unary<v1::ListJobsRequest, v1::ListJobsResponse>(
            fz, [&](auto* c, auto& q, auto* p) { return jobs_->ListJobs(c, q, p); });
        break;
      case 3:
        Unary<v1::CancelJobRequest, v1::CancelJobResponse>(fz, [&](auto* c, auto& q, auto* p) {
          if (q.job_id() == *target) q.set_job_id("job-999999");  // Keep the target alive.
          return jobs_->CancelJob(c, q, p);
        });
        break;
      case 4:
        Unary<v1::ResumeJobRequest, v1::ResumeJobResponse>(
            fz, [&](auto* c, auto& q, auto* p) { return jobs_->ResumeJob(c, q, p); });
        break;
      case 5:
        Unary<v1::ListWorkersRequest, v1::ListWorkersResponse>(
            fz, [&](auto* c, auto& q, auto* p) { return jobs_->ListWorkers(c, q, p); });
        break;
      case 6:
        if (fz.Chance(2)) {
          Stream<v1::WatchJobRequest, v1::JobEvent>(
              fz, [&](auto* c, auto& q) { return jobs_->WatchJob(c, q); });
        } else {
          Stream<v1::GetJobLogsRequest, v1::GetJobLogsResponse>(
              fz, [&](auto* c, auto& q) { return jobs_->GetJobLogs(c, q); });
        }
        break;
      case 7:
        Unary<v1::RegisterRequest, v1::RegisterResponse>(fz, [&](auto* c, auto& q, auto* p) {
          // Never the honest worker's name: taking it over is the security suite's case.
          if (q.name() == "honest") q.set_name("fuzzed-name");
          return workers->Register(c, q, p);
        });
        break;
      default: {  // Session messages of every kind, in turn, from a registered worker.
        v1::WorkerMessage m;
        const FieldDescriptor* kind = kinds->field((round / 10) % kinds->field_count());
        if (kind->name() == "hello") kind = kinds->field(((round / 10) + 1) % kinds->field_count());
        // Well-formed means within the 4 MiB message limit too (a bigger one ends the
        // stream in gRPC itself, before any handler).
        do {
          m.Clear();
          fz.FillField(&m, kind, 0);
        } while (m.ByteSizeLong() > (1u << 20));
        ASSERT_TRUE(fuzzer_worker.Send(std::move(m)));
        ASSERT_FALSE(fuzzer_worker.closed()) << "round " << round << ": the session was closed";
        break;
      }
    }
  }

  // The fuzz reached both sides of the handlers: accepted and refused calls, and
  // worker messages the coordinator acknowledged and rejected.
  EXPECT_GT(accepted_submits_, 0);
  EXPECT_GT(codes_[grpc::StatusCode::OK], 0);
  EXPECT_GT(codes_[grpc::StatusCode::INVALID_ARGUMENT], 0);
  int ok_acks = 0, refused_acks = 0;
  auto is_ack = [](const v1::CoordinatorMessage& m) { return m.has_ack(); };
  while (auto m = fuzzer_worker.WaitFor(is_ack, std::chrono::milliseconds(200))) {
    (m->ack().result() == v1::ACK_CODE_OK ? ok_acks : refused_acks)++;
  }
  EXPECT_GT(ok_acks, 0);
  EXPECT_GT(refused_acks, 0);
  for (const auto& [code, n] : codes_) std::cout << "gRPC code " << code << ": " << n << "\n";
  std::cout << "acks ok " << ok_acks << ", refused " << refused_acks << "\n";

  // Still up, healthy, every read answers.
  EXPECT_TRUE(Serving());
  v1::ListJobsRequest list;
  v1::ListJobsResponse jobs;
  grpc::ClientContext lctx;
  ASSERT_TRUE(jobs_->ListJobs(&lctx, list, &jobs).ok());
  for (const v1::Job& j : jobs.jobs()) {
    EXPECT_TRUE(v1::JobState_IsValid(j.state())) << j.id();
    // No accepted job holds a directory a second YAML or shell reading could change.
    EXPECT_TRUE(spec::CheckPathText("checkpoint_dir", j.checkpoint_dir()).ok())
        << j.id() << ": " << j.checkpoint_dir();
    EXPECT_FALSE(absl::StartsWith(j.checkpoint_dir(), root + "/dangling")) << j.id();
    EXPECT_GE(j.restarts(), 0) << j.id();
    for (const v1::StageStatus& st : j.stages()) {
      EXPECT_TRUE(std::isfinite(st.progress().loss())) << j.id();
      EXPECT_LE(st.progress().step(), st.steps()) << j.id();
    }
  }
  // The honest job kept its one attempt (nothing the fuzzer sent restarted or ended it).
  v1::Job t = GetJob(*target);
  EXPECT_EQ(t.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(t.attempts_size(), 1);

  // Consistent: an honest worker still runs a fresh job to SUCCEEDED. Clear the queue
  // of what the fuzzer submitted (cancel is the documented way) and let its worker go.
  for (const v1::Job& j : jobs.jobs()) {
    if (j.id() == *target) continue;
    v1::CancelJobRequest cancel;
    cancel.set_job_id(j.id());
    v1::CancelJobResponse cancelled;
    grpc::ClientContext cctx;
    SetDeadlineAfter(&cctx, absl::Seconds(10));
    grpc::Status cs = jobs_->CancelJob(&cctx, cancel, &cancelled);
    EXPECT_TRUE(cs.ok() || cs.error_code() == grpc::StatusCode::FAILED_PRECONDITION)
        << j.id() << ": " << cs.error_message();
  }
  fuzzer_worker.Disconnect();
  ASSERT_TRUE(honest.CommitLast(*a));
  honest.Exited(a->ref(), 0);  // Finish the target: it holds the honest worker.
  ASSERT_TRUE(WaitState(*target, v1::JOB_STATE_SUCCEEDED));
  auto fresh = Submit(JobYaml("after-fuzz", "    - {seq_len: 256, steps: 2}\n"));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  FakeWorker& clean = AddWorker("clean");
  std::optional<v1::Assignment> b;
  FakeWorker* b_worker = nullptr;
  ASSERT_TRUE(testing::PollUntil([&] {
    for (FakeWorker* w : {&honest, &clean}) {
      auto got = w->WaitAssignment(std::chrono::milliseconds(20));
      if (got && got->ref().job_id() == *fresh) {
        b = got;
        b_worker = w;
        return true;
      }
    }
    return false;
  }));
  b_worker->Started(b->ref());
  ASSERT_TRUE(b_worker->CommitLast(*b));
  b_worker->Exited(b->ref(), 0);
  EXPECT_TRUE(WaitState(*fresh, v1::JOB_STATE_SUCCEEDED));
  EXPECT_TRUE(Serving());
}

}  // namespace
}  // namespace ulysses::coordinator
