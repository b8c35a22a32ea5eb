// Checks the evolution rules of the ulysses.v1 API on the compiled descriptors:
// every enum starts with <NAME>_UNSPECIFIED = 0, every message reserves 100..199,
// and messages round-trip through the wire format.
#include <string>

#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "ulysses/v1/job_service.grpc.pb.h"
#include "ulysses/v1/types.pb.h"
#include "ulysses/v1/worker_service.grpc.pb.h"

namespace ulysses::v1 {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FileDescriptor;

std::string UpperSnake(const std::string& camel) {
  std::string out;
  for (size_t i = 0; i < camel.size(); ++i) {
    char c = camel[i];
    if (i > 0 && c >= 'A' && c <= 'Z') out += '_';
    out += static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  }
  return out;
}

void CheckMessage(const Descriptor* d) {
  bool reserved = false;
  for (int i = 0; i < d->reserved_range_count(); ++i) {
    const auto* r = d->reserved_range(i);
    if (r->start <= 100 && r->end >= 200) reserved = true;
  }
  EXPECT_TRUE(reserved) << d->full_name() << " must reserve 100 to 199";
  for (int i = 0; i < d->field_count(); ++i) {
    EXPECT_FALSE(d->field(i)->is_required()) << d->field(i)->full_name();
  }
  for (int i = 0; i < d->nested_type_count(); ++i) CheckMessage(d->nested_type(i));
}

void CheckEnum(const EnumDescriptor* e) {
  ASSERT_GT(e->value_count(), 0);
  EXPECT_EQ(e->value(0)->number(), 0) << e->full_name();
  EXPECT_EQ(e->value(0)->name(), UpperSnake(e->name()) + "_UNSPECIFIED") << e->full_name();
}

void CheckFile(const FileDescriptor* f) {
  EXPECT_EQ(f->package(), "ulysses.v1");
  for (int i = 0; i < f->message_type_count(); ++i) CheckMessage(f->message_type(i));
  for (int i = 0; i < f->enum_type_count(); ++i) CheckEnum(f->enum_type(i));
}

TEST(ApiShapeTest, EvolutionRulesHoldForEveryFile) {
  CheckFile(Job::descriptor()->file());
  CheckFile(SubmitJobRequest::descriptor()->file());
  CheckFile(WorkerMessage::descriptor()->file());
  EXPECT_GE(Job::descriptor()->file()->enum_type_count(), 4);
}

TEST(ApiShapeTest, ServicesExposeTheDocumentedMethods) {
  const auto* jobs = JobService::service_full_name();
  EXPECT_STREQ(jobs, "ulysses.v1.JobService");
  const auto* svc = SubmitJobRequest::descriptor()->file()->FindServiceByName("JobService");
  ASSERT_NE(svc, nullptr);
  for (const char* m : {"SubmitJob", "GetJob", "ListJobs", "CancelJob", "ResumeJob", "WatchJob",
                        "GetJobLogs", "ListWorkers"}) {
    EXPECT_NE(svc->FindMethodByName(m), nullptr) << m;
  }
  EXPECT_TRUE(svc->FindMethodByName("WatchJob")->server_streaming());
  const auto* workers = WorkerMessage::descriptor()->file()->FindServiceByName("WorkerService");
  ASSERT_NE(workers, nullptr);
  const auto* session = workers->FindMethodByName("Session");
  ASSERT_NE(session, nullptr);
  EXPECT_TRUE(session->client_streaming());
  EXPECT_TRUE(session->server_streaming());
}

TEST(ApiShapeTest, AssignmentRoundTripsThroughTheWireFormat) {
  CoordinatorMessage msg;
  Assignment* a = msg.mutable_assignment();
  a->mutable_ref()->set_job_id("job-000001");
  a->mutable_ref()->set_generation(3);
  a->mutable_ref()->set_rank(1);
  a->set_world_size(2);
  a->set_master_addr("127.0.0.1");
  a->set_master_port(29500);
  a->add_overrides("spec.checkpoint.dir=/ckpt/job-000001");
  std::string wire;
  ASSERT_TRUE(msg.SerializeToString(&wire));
  CoordinatorMessage back;
  ASSERT_TRUE(back.ParseFromString(wire));
  ASSERT_TRUE(back.has_assignment());
  EXPECT_EQ(back.assignment().ref().generation(), 3);
  EXPECT_EQ(back.assignment().master_port(), 29500);
  EXPECT_EQ(back.assignment().overrides(0), "spec.checkpoint.dir=/ckpt/job-000001");
  // An unknown enum value from a newer server survives a round trip (open enums).
  Job job;
  job.set_state(static_cast<JobState>(42));
  ASSERT_TRUE(job.SerializeToString(&wire));
  Job job_back;
  ASSERT_TRUE(job_back.ParseFromString(wire));
  EXPECT_EQ(static_cast<int>(job_back.state()), 42);
}

}  // namespace
}  // namespace ulysses::v1
