// One training rank of one stage, before its first step: the job and stage checked
// (ResolveRankInputs) and where the stage starts decided (PlanResume), no network yet; then the
// rank built in order (BuildRankState): model config, training data, rendezvous and model
// (rank_setup.h), weights and optimizer state from the checkpoint, the HF import or the seeded
// init, ZeRO sharding, and the Trainer. engine.cc sequences these with the stage loop
// (stage_loop.h).
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_RANK_STATE_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_RANK_STATE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "common/spec/job_spec_parser.h"
#include "worker/engine/data/dataset.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/train/engine.h"
#include "worker/engine/train/optimizer.h"
#include "worker/engine/train/rank_setup.h"
#include "worker/engine/train/resume.h"
#include "worker/engine/train/train_step.h"
#include "worker/engine/train/zero.h"

namespace ulysses::engine::train {

struct RankInputs {
  spec::JobSpec spec;
  int stage = 0;                // --stage, in range
  int64_t sp = 1, dp = 1;       // the stage's layout
  std::string checkpoint_root;  // CheckpointRoot(spec, --out)
  ResumePlan plan;              // where the stage starts (PlanResume, resume.h)
};

// Loads the job (with --set overrides) and checks --stage, --out and that the stage's seq_len
// divides by its SP degree; `plan` is left to the caller (PlanResume). Bad input fails fast on
// every rank, before any rendezvous.
absl::StatusOr<RankInputs> ResolveRankInputs(const RankOptions& o);

// Everything the stage loop works on. Built once and never moved (the Trainer and the ZeRO
// sharding hold pointers to the model, the AdamW and the communicators).
struct RankState {
  model::LlamaConfig config;
  std::unique_ptr<TokenDataset> train_data;
  RankSetup setup;
  std::unique_ptr<AdamW> adam;
  std::unique_ptr<ZeroSharding> zero;  // null at ZeRO stage 0
  std::unique_ptr<Trainer> trainer;
  int64_t global_step = 0;  // optimizer steps over all stages so far
  int64_t start_step = 0;   // the first step of this stage to run
  // The collective timeout, grown with the checkpoint's size (resume.h).
  std::chrono::milliseconds collective_timeout{0};
};

// Where this rank's weights and optimizer state come from, decided once from the resume plan and
// the spec (init / import / resume x ZeRO-3 or not); BuildRankState executes it step by step.
enum class StateSource { kInit, kImport, kResume };
struct StatePlan {
  StateSource source = StateSource::kInit;
  int zero_stage = 0;
  bool config_from_checkpoint = false;  // resume: the checkpoint's model config, not the spec's
  bool sharded_init = false;            // ZeRO-3: no rank builds the whole model (zero.h)
  bool restore_whole_model = false;     // resume below ZeRO-3: the share into the model
  bool import_whole_model = false;      // import below ZeRO-3: init_from into the model
  bool import_chunks = false;           // import at ZeRO-3: init_from's byte ranges, by chunk
  bool seed_chunks = false;             // init with ZeRO: the chunks made from the seed
  bool restore_optimizer = false;       // resume: AdamW moments, step counts, the loss scale
  const char* Name() const;             // "init", "import" or "resume": the start-up log line
};
StatePlan PlanRankState(const spec::JobSpec& spec, const ResumePlan& resume);

// Rendezvous, model and state for in.plan: the checkpoint's share of this rank (resume),
// spec.model.init_from (import, by byte ranges at ZeRO-3) or the seeded init; in.plan.state's
// tensors are released once loaded into the model and optimizer. Logs the start-up peak RSS.
absl::StatusOr<std::unique_ptr<RankState>> BuildRankState(const RankOptions& o, RankInputs& in);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_RANK_STATE_H_
