// The finding: `--log-format json` emitted plain-text "[libprotobuf ERROR ...]" lines among
// the JSON ones. RouteLibraryLogs sends libprotobuf's and gRPC's lines through our logger.
#include "common/grpc/library_logs.h"

#include <google/protobuf/duration.pb.h>
#include <google/protobuf/text_format.h>
#include <grpc/grpc.h>
#include <grpc/support/log.h>

#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "common/log_format.h"
#include "gtest/gtest.h"

namespace ulysses {
namespace {

TEST(LibraryLogsTest, ProtobufAndGrpcLinesAreJsonInJsonMode) {
  RouteLibraryLogs();
  grpc_init();  // As the first channel or server of a process does, after main() routed them.
  ASSERT_TRUE(SetLogFormatFromFlag("--log-format", "json").ok());
  ::testing::internal::CaptureStderr();
  google::protobuf::Duration d;
  EXPECT_FALSE(google::protobuf::TextFormat::ParseFromString("no_such_field: 1", &d));
  gpr_log(GPR_ERROR, "probe %d", 7);
  const std::string err = ::testing::internal::GetCapturedStderr();
  grpc_shutdown();
  ASSERT_TRUE(SetLogFormatFromFlag("--log-format", "text").ok());
  int protobuf_lines = 0, grpc_lines = 0;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    EXPECT_TRUE(absl::StartsWith(line, "{\"time\":\"")) << "not a JSON line: " << line;
    EXPECT_FALSE(absl::StrContains(line, "[libprotobuf")) << line;
    protobuf_lines +=
        absl::StrContains(line, "libprotobuf: ") && absl::StrContains(line, "\"level\":\"error\"");
    grpc_lines += absl::StrContains(line, "grpc: probe 7");
  }
  EXPECT_EQ(protobuf_lines, 1) << err;
  EXPECT_EQ(grpc_lines, 1) << err;
}

}  // namespace
}  // namespace ulysses
