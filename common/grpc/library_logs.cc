#include "common/grpc/library_logs.h"

#include <google/protobuf/stubs/logging.h>
#include <grpc/support/log.h>

#include <string>

#include "common/logging.h"

namespace ulysses {
namespace {

void EmitLine(LogLevel level, const char* file, int line, const std::string& message) {
  // Never kFatal here: the library aborts by itself after a fatal line.
  internal::LogMessage(level == LogLevel::kFatal ? LogLevel::kError : level, file, line).stream()
      << message;
}

void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                 const std::string& message) {
  LogLevel ours = LogLevel::kInfo;
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO:
      ours = LogLevel::kInfo;
      break;
    case google::protobuf::LOGLEVEL_WARNING:
      ours = LogLevel::kWarning;
      break;
    case google::protobuf::LOGLEVEL_ERROR:
      ours = LogLevel::kError;
      break;
    case google::protobuf::LOGLEVEL_FATAL:
      ours = LogLevel::kFatal;
      break;
  }
  if (ours < GetLogLevel()) return;
  EmitLine(ours, file, line, "libprotobuf: " + message);
}

void GrpcLog(gpr_log_func_args* args) {
  LogLevel ours = args->severity == GPR_LOG_SEVERITY_ERROR  ? LogLevel::kError
                  : args->severity == GPR_LOG_SEVERITY_INFO ? LogLevel::kInfo
                                                            : LogLevel::kDebug;
  if (ours < GetLogLevel()) return;
  EmitLine(ours, args->file, args->line, std::string("grpc: ") + args->message);
}

}  // namespace

void RouteLibraryLogs() {
  google::protobuf::SetLogHandler(&ProtobufLog);
  gpr_set_log_function(&GrpcLog);
}

}  // namespace ulysses
