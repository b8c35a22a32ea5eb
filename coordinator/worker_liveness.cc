// JobMachine: the SUSPECT window of worker liveness (docs/COORDINATOR.md "Worker
// liveness"). A worker silent past heartbeat_timeout_s gets no new work but keeps its
// ranks; only lost_after_s of silence, or a broken collective reported by its job's
// ranks while it is silent, ends their attempt.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "coordinator/job_machine.h"

namespace ulysses::coordinator {
namespace {

// The jobs (each once) whose current attempt `worker` holds ranks of.
std::set<JobRt*> JobsHeldBy(State& state, const WorkerRt& worker) {
  std::set<JobRt*> out;
  for (const auto& [slot, ref] : worker.slots) {
    JobRt* job = state.FindJob(ref.job_id());
    const AttemptRecord* a = job == nullptr ? nullptr : job->rec.current_attempt();
    if (a != nullptr && !a->ended() && a->generation == ref.generation()) out.insert(job);
  }
  return out;
}

}  // namespace

void JobMachine::OnWorkerSuspect(WorkerRt& worker, int64_t silent_ms, Txn& txn) {
  if (worker.state == v1::WORKER_STATE_SUSPECT || worker.state == v1::WORKER_STATE_LOST) return;
  worker.state = v1::WORKER_STATE_SUSPECT;
  const std::string why = absl::StrFormat(
      "worker %s SUSPECT: no message for %.1fs (heartbeat_timeout_s %g); it gets no new work, "
      "its ranks keep running, LOST after %gs of silence",
      worker.rec.name, silent_ms / 1000.0, config_.heartbeat_timeout_s, config_.lost_after_s);
  ULOG(WARNING) << why;
  for (JobRt* job : JobsHeldBy(state_, worker)) {
    v1::LogLine line;
    line.set_stream(v1::LOG_STREAM_COORDINATOR);
    line.set_text(why);
    AddLog(*job, std::move(line), txn);
  }
}

void JobMachine::OnWorkerBack(WorkerRt& worker, int64_t silent_ms, Txn& txn) {
  if (worker.state != v1::WORKER_STATE_SUSPECT) return;
  worker.state = worker.sink == nullptr ? v1::WORKER_STATE_DISCONNECTED
                 : worker.busy()        ? v1::WORKER_STATE_BUSY
                                        : v1::WORKER_STATE_IDLE;
  const std::string why =
      absl::StrFormat("worker %s answered again after %.1fs of silence; its ranks were kept",
                      worker.rec.name, silent_ms / 1000.0);
  ULOG(INFO) << why;
  for (JobRt* job : JobsHeldBy(state_, worker)) {
    v1::LogLine line;
    line.set_stream(v1::LOG_STREAM_COORDINATOR);
    line.set_text(why);
    AddLog(*job, std::move(line), txn);
  }
}

bool JobMachine::LoseSuspectPeers(const AttemptRecord& attempt, const std::string& why, Txn& txn) {
  bool lost = false;
  std::set<std::string> seen;
  const std::vector<std::string> ids = attempt.worker_ids;  // OnWorkerLost ends the attempt.
  for (const std::string& id : ids) {
    if (!seen.insert(id).second) continue;
    WorkerRt* w = state_.FindWorker(id);
    if (w == nullptr ||
        (w->state != v1::WORKER_STATE_SUSPECT && w->state != v1::WORKER_STATE_DISCONNECTED)) {
      continue;
    }
    OnWorkerLost(*w,
                 absl::StrCat(why, " while it was ",
                              w->state == v1::WORKER_STATE_SUSPECT ? "SUSPECT" : "DISCONNECTED"),
                 txn);
    lost = true;
  }
  return lost;
}

}  // namespace ulysses::coordinator
