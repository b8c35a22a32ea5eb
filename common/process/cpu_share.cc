#include "common/process/cpu_share.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace ulysses::process {

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

int IntraOpThreadShare(int cores, int local_ranks) {
  return std::max(1, std::max(cores, 1) / std::max(local_ranks, 1));
}

std::vector<std::string> RankEnvironmentDefaults() { return {"OMP_WAIT_POLICY=PASSIVE"}; }

}  // namespace ulysses::process
