// Lower-case names of the API's enums, as people read them in flags, logs, metrics labels and
// `ulyssesctl -o json` (one spelling per value, derived from the proto's own value names).
#ifndef ULYSSES_PROTO_ENUM_NAMES_H_
#define ULYSSES_PROTO_ENUM_NAMES_H_

#include <string>

#include "ulysses/v1/types.pb.h"

namespace ulysses::v1 {

// "sockets", "efa", "tcpxo", "ib"; "unspecified" for FABRIC_UNSPECIFIED (an agent older than
// the field). The proto value name without its FABRIC_ prefix, lower-cased.
std::string FabricName(Fabric fabric);

}  // namespace ulysses::v1

#endif  // ULYSSES_PROTO_ENUM_NAMES_H_
