#include "common/process/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace ulysses::process {

int64_t ReadCgroupBytes(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return 0;
  try {
    const long long v = std::stoll(text);
    return v > 0 && v < (int64_t{1} << 60) ? v : 0;
  } catch (...) {  // Not a number, or out of range.
    return 0;
  }
}

int64_t CgroupMemoryLimitBytes(const std::string& root) {
  const int64_t v2 = ReadCgroupBytes(root + "/memory.max");
  return v2 > 0 ? v2 : ReadCgroupBytes(root + "/memory/memory.limit_in_bytes");
}

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

int64_t AvailableHostMemoryBytes(const std::string& cgroup_root) {
  int64_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  }
  const int64_t limit = CgroupMemoryLimitBytes(cgroup_root);
  if (limit > 0) {
    int64_t used = ReadCgroupBytes(cgroup_root + "/memory.current");
    if (used == 0) used = ReadCgroupBytes(cgroup_root + "/memory/memory.usage_in_bytes");
    const int64_t left = std::max<int64_t>(0, limit - used);
    available = available > 0 ? std::min(available, left) : left;
  }
  return available;
}

}  // namespace ulysses::process
