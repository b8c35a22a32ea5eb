// RouteLibraryLogs: libprotobuf's and gRPC's own log lines go through common/logging.h, so
// `--log-format json` gives one JSON object per line for them too (before: plain-text
// "[libprotobuf ERROR ...]" and gRPC "E1204 ..." lines among the JSON ones), with the level
// mapped and the library's file:line as the source. Call once, early in main().
#ifndef ULYSSES_COMMON_GRPC_LIBRARY_LOGS_H_
#define ULYSSES_COMMON_GRPC_LIBRARY_LOGS_H_

namespace ulysses {

void RouteLibraryLogs();

}  // namespace ulysses

#endif  // ULYSSES_COMMON_GRPC_LIBRARY_LOGS_H_
