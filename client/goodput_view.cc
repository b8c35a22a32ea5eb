#include "client/goodput_view.h"

#include "absl/strings/str_format.h"

namespace ulysses::client {

nlohmann::json GoodputJson(const ulysses::v1::Goodput& g) {
  return {{"ratio", g.ratio()},
          {"allocated_gpu_seconds", g.allocated_gpu_seconds()},
          {"productive_gpu_seconds", g.productive_gpu_seconds()},
          {"uncommitted_gpu_seconds", g.uncommitted_gpu_seconds()},
          {"lost_gpu_seconds",
           {{"failure", g.lost_failure_gpu_seconds()},
            {"preemption", g.lost_preemption_gpu_seconds()},
            {"restart", g.lost_restart_gpu_seconds()},
            {"checkpoint_stall", g.lost_checkpoint_stall_gpu_seconds()},
            {"cancelled", g.lost_cancelled_gpu_seconds()}}}};
}

std::string GoodputText(const ulysses::v1::Goodput& g) {
  if (g.allocated_gpu_seconds() <= 0) return "-";
  return absl::StrFormat(
      "%.1f%% of %.1f GPU-s productive; lost: failure %.1f, preemption %.1f, restart %.1f, "
      "checkpoint_stall %.1f, cancelled %.1f; uncommitted %.1f",
      g.ratio() * 100, g.allocated_gpu_seconds(), g.lost_failure_gpu_seconds(),
      g.lost_preemption_gpu_seconds(), g.lost_restart_gpu_seconds(),
      g.lost_checkpoint_stall_gpu_seconds(), g.lost_cancelled_gpu_seconds(),
      g.uncommitted_gpu_seconds());
}

std::string GoodputCell(const ulysses::v1::Goodput& g) {
  return g.allocated_gpu_seconds() <= 0 ? "-" : absl::StrFormat("%.1f%%", g.ratio() * 100);
}

}  // namespace ulysses::client
