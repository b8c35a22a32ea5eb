#include "worker/engine/train/step_agreement.h"

namespace ulysses::engine::train {

torch::Tensor StepAgreement::Pack(bool stop, int rank, int world, double step_seconds,
                                  const std::array<float, CheckpointSchedule::kSlots>& schedule) {
  torch::Tensor t = torch::zeros({Size(world)}, torch::kFloat32);  // [1 + world + kSlots]
  float* v = t.data_ptr<float>();
  v[0] = stop ? 1.0f : 0.0f;
  v[1 + rank] = static_cast<float>(step_seconds);
  for (int i = 0; i < CheckpointSchedule::kSlots; ++i) v[1 + world + i] = schedule[i];
  return t;
}

StepAgreement StepAgreement::Unpack(const torch::Tensor& reduced, int world) {
  const torch::Tensor t = reduced.cpu().contiguous();  // [1 + world + kSlots]
  const float* v = t.data_ptr<float>();
  StepAgreement a;
  a.stop = v[0] > 0;
  a.rank_seconds.resize(world);
  for (int r = 0; r < world; ++r) a.rank_seconds[r] = v[1 + r];
  for (int i = 0; i < CheckpointSchedule::kSlots; ++i) a.schedule[i] = v[1 + world + i];
  return a;
}

}  // namespace ulysses::engine::train
