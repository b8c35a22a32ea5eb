// StreamLimits: caps the JobService streams (WatchJob and every GetJobLogs, a tail too:
// an unread reply holds its queue as long as a follow) that are open on the coordinator, per caller
// identity, per tenant and in total, so one client (or one leaked script) cannot pin thousands of
// reactors and their queues, and one tenant's users cannot take every slot of the others. A stream
// holds its slot from its start until its reactor is done. Thread-safe.
#ifndef ULYSSES_COORDINATOR_STREAM_LIMITS_H_
#define ULYSSES_COORDINATOR_STREAM_LIMITS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/auth/principal.h"

namespace ulysses::coordinator {

struct StreamLimitsConfig {
  int64_t per_identity = 64;
  int64_t total = 4096;
  int64_t queue_bytes = 4 << 20;  // Bytes one stream's send queue may hold.
  int64_t per_tenant = 1024;      // All identities of one tenant together.
  int64_t stall_ms = 60000;       // How long one write may wait for the client.
};

class StreamLimits {
 public:
  // 1 <= `per_identity` <= `per_tenant` <= `total` (CoordinatorConfig validates them); a
  // `per_tenant` of 0 means `total`.
  StreamLimits(int64_t per_identity, int64_t total, int64_t queue_bytes = 4 << 20,
               int64_t per_tenant = 0, int64_t stall_ms = 60000)
      : per_identity_(per_identity),
        per_tenant_(per_tenant > 0 ? per_tenant : total),
        total_(total),
        queue_bytes_(queue_bytes),
        stall_ms_(stall_ms) {}
  // The byte bound of each stream's send queue (StreamLimitsConfig::queue_bytes).
  int64_t queue_bytes() const { return queue_bytes_; }
  // How long one write may wait for the client (StreamLimitsConfig::stall_ms).
  int64_t stall_ms() const { return stall_ms_; }

  // The key streams are counted under: the token's user and tenant, or the certificate's CN.
  static std::string IdentityOf(const auth::Principal& caller);

  // Takes a slot for `identity` of `tenant`; RESOURCE_EXHAUSTED (naming the limit and the
  // fix) when the identity, its tenant or the coordinator is at its cap. Each OK must be
  // paired with a Release of the same pair.
  absl::Status Acquire(const std::string& identity, const std::string& tenant = "");
  void Release(const std::string& identity, const std::string& tenant = "");

  int64_t open() const;

 private:
  const int64_t per_identity_;
  const int64_t per_tenant_;
  const int64_t total_;
  const int64_t queue_bytes_;
  const int64_t stall_ms_;
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t> by_identity_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> by_tenant_ ABSL_GUARDED_BY(mu_);
  int64_t open_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_STREAM_LIMITS_H_
