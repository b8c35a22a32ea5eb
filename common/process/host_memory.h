// The memory of the host a process runs on, as the kernel and the process's cgroup report
// it: what the engine's checkpoint saver may spend on snapshots and the memory limit the step
// meter reports. Every function returns 0 for "unknown" (or "no limit").
#ifndef ULYSSES_COMMON_PROCESS_HOST_MEMORY_H_
#define ULYSSES_COMMON_PROCESS_HOST_MEMORY_H_

#include <cstdint>
#include <string>

namespace ulysses::process {

// A cgroup file holding a byte count (memory.max, memory.current, memory.limit_in_bytes):
// the count; 0 for "max", for 2^60 or more (cgroup v1 writes "no limit" as ~2^63), and for a
// file that is absent, unreadable or not a positive number.
int64_t ReadCgroupBytes(const std::string& path);

// The memory limit of the cgroup at `root` (a cgroup v2 memory.max, else v1's
// memory/memory.limit_in_bytes); 0 when there is none.
int64_t CgroupMemoryLimitBytes(const std::string& root = "/sys/fs/cgroup");

// The machine's physical memory (sysconf).
int64_t PhysicalMemoryBytes();

// Memory this process may still use: /proc/meminfo's MemAvailable, capped by the cgroup's
// limit minus its usage when it has a limit.
int64_t AvailableHostMemoryBytes(const std::string& cgroup_root = "/sys/fs/cgroup");

}  // namespace ulysses::process

#endif  // ULYSSES_COMMON_PROCESS_HOST_MEMORY_H_
