#include "ulysses/v1/enum_names.h"

#include <cctype>

namespace ulysses::v1 {

std::string FabricName(Fabric fabric) {
  // Fabric_Name: "FABRIC_EFA"; an out-of-range value (a newer peer's) reads as unspecified.
  const std::string& full =
      Fabric_IsValid(fabric) ? Fabric_Name(fabric) : Fabric_Name(FABRIC_UNSPECIFIED);
  constexpr size_t kPrefix = sizeof("FABRIC_") - 1;
  std::string name = full.substr(kPrefix);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

}  // namespace ulysses::v1
