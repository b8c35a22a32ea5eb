#include "coordinator/checkpoint_verify.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ulysses::coordinator {
namespace {

absl::Status Refused(const ExpectedCheckpoint& e, const std::string& why) {
  return absl::FailedPreconditionError(
      absl::StrCat("the final checkpoint ", e.path, " reported by rank 0 ", why));
}

}  // namespace

absl::Status VerifyFinalCheckpoint(const ExpectedCheckpoint& e) {
  const std::string manifest_path = e.path + "/manifest.json";
  struct stat st;
  if (stat(manifest_path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return Refused(e, "has no manifest.json on disk (not committed, or never written)");
  }
  if (st.st_size > kMaxManifestBytes) {
    return Refused(e, absl::StrCat("has a manifest of ", st.st_size, " bytes (at most ",
                                   kMaxManifestBytes, ")"));
  }
  std::ifstream in(manifest_path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json m = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object() || !m.contains("format") || !m["format"].is_string() ||
      m["format"].get<std::string>() != "ulysses-checkpoint") {
    return Refused(e, "has a manifest that is not a ulysses-checkpoint manifest");
  }
  const auto number = [&](const char* key) -> int64_t {
    return m.contains(key) && m[key].is_number_integer() ? m[key].get<int64_t>() : -1;
  };
  if (number("stage") != e.stage || number("step_in_stage") != e.step) {
    return Refused(
        e, absl::StrCat("is of stage ", number("stage") + 1, " step ", number("step_in_stage"),
                        ", not the final stage ", e.stage + 1, " step ", e.step));
  }
  if (m.contains("owner")) {
    const nlohmann::json& o = m["owner"];
    const bool ours =
        o.is_object() && o.value("job", "") == e.job_id && o.value("tenant", "") == e.tenant;
    if (!ours) return Refused(e, "was written by another job (its manifest's owner)");
  }
  if (!m.contains("shards") || !m["shards"].is_array() || m["shards"].empty()) {
    return Refused(e, "has a manifest without shards");
  }
  for (const nlohmann::json& shard : m["shards"]) {
    const std::string file =
        shard.is_object() && shard.contains("file") && shard["file"].is_string()
            ? shard["file"].get<std::string>()
            : "";
    const int64_t bytes =
        shard.is_object() && shard.contains("bytes") && shard["bytes"].is_number_integer()
            ? shard["bytes"].get<int64_t>()
            : -1;
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      return Refused(e, "has a manifest with a malformed shard entry");
    }
    struct stat sst;
    if (stat((e.path + "/" + file).c_str(), &sst) != 0 || !S_ISREG(sst.st_mode) ||
        sst.st_size != bytes) {
      return Refused(e, absl::StrCat("lacks its shard ", file, " of ", bytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ulysses::coordinator
