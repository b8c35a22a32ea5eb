// Evaluation of one rank of an (SP x DP) layout: validation loss, and retrieval accuracy where the
// data scores target positions (synthetic needle data). Every rank returns the same global numbers.
//
// DP replica d evaluates sequences d, d + dp, ...; every replica runs ceil(n / dp) forward passes
// (a short share is padded with a re-run of sequence 0 that counts nothing), so every rank enters
// every collective of a forward even when n does not divide by dp (ZeRO-3 gathers layers over the
// world). Each SP group shards every sequence like
// training does; (loss sum, tokens, correct, scored) are summed over the world, so the result is
// independent of the layout (evaluation under SP equals SP 1 up to float reassociation).
// Not thread-safe; borrows its arguments. libtorch exceptions become a Status.
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_EVALUATE_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_EVALUATE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/engine/data/dataset.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/parallel/parallelize.h"

namespace ulysses::engine::train {

struct EvalResult {
  double loss = 0;
  int64_t tokens = 0;
  bool has_accuracy = false;
  double accuracy = 0;
};

// Number of validation sequences of seq_len the spec evaluates (the file's windows, or the
// synthetic generator's validation_sequences), at most max_sequences when > 0 (spec eval:
// the first max_sequences of the validation order); INVALID_ARGUMENT naming the fix when none.
absl::StatusOr<int64_t> ValidationSequences(const spec::JobSpec& spec, const TokenDataset& val,
                                            int64_t seq_len, int64_t max_sequences = 0);

absl::StatusOr<EvalResult> Evaluate(model::LlamaForCausalLM& model,
                                    const AttentionCallback& attention, const ParallelRuntime& rt,
                                    const TokenDataset& val, int64_t num_sequences, int64_t seq_len,
                                    bool report_accuracy);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_EVALUATE_H_
