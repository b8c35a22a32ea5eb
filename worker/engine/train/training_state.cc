#include "worker/engine/train/training_state.h"

#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/train/model_io.h"

namespace ulysses::engine::train {
namespace {

using json = nlohmann::json;

absl::Status Bad(const std::string& where, const char* key, const json& value, const char* want) {
  return absl::DataLossError(
      absl::StrCat(where, " extra.", key, ": ", value.dump(), " is not ", want));
}

// An integer key >= 0 into `out` when present.
absl::Status ReadCount(const json& extra, const char* key, const std::string& where,
                       std::optional<int64_t>* out) {
  auto it = extra.find(key);
  if (it == extra.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer() || it->get<int64_t>() < 0) {
    return Bad(where, key, *it, "an integer >= 0");
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadString(const json& extra, const char* key, const std::string& where,
                        std::string* out) {
  auto it = extra.find(key);
  if (it == extra.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return Bad(where, key, *it, "a string");
  *out = it->get<std::string>();
  return absl::OkStatus();
}

}  // namespace

json TrainingState::ToJson() const {
  json j{{"seed", seed}, {"sp_degree", sp_degree}, {"dp_degree", dp_degree}};
  if (model_config) j["model_config"] = ModelConfigToJson(*model_config);
  if (!dtype.empty()) j["dtype"] = dtype;
  if (!init_from.empty()) j["init_from"] = init_from;
  if (loss_scale) {
    j["loss_scale"] = *loss_scale;
    j["loss_scale_good_steps"] = loss_scale_good_steps;
  }
  if (data_cursor) j["data_cursor"] = *data_cursor;
  if (adam_steps) j["adam_steps"] = *adam_steps;
  return j;
}

absl::StatusOr<TrainingState> TrainingState::FromJson(const json& extra, const std::string& where) {
  TrainingState t;
  if (!extra.is_object()) {
    return absl::DataLossError(absl::StrCat(where, " extra: ", extra.dump(), " is not an object"));
  }
  if (auto it = extra.find("seed"); it != extra.end() && !it->is_null()) {
    if (!it->is_number_integer()) return Bad(where, "seed", *it, "an integer");
    t.seed = it->get<int64_t>();
  }
  std::optional<int64_t> n;
  RETURN_IF_ERROR(ReadCount(extra, "sp_degree", where, &n));
  t.sp_degree = n.value_or(0);
  n.reset();
  RETURN_IF_ERROR(ReadCount(extra, "dp_degree", where, &n));
  t.dp_degree = n.value_or(0);
  if (auto it = extra.find("model_config"); it != extra.end() && !it->is_null()) {
    absl::StatusOr<model::LlamaConfig> config = ModelConfigFromJson(*it);
    if (!config.ok()) {
      return absl::DataLossError(
          absl::StrCat(where, " extra.model_config: ", config.status().message()));
    }
    t.model_config = *config;
  }
  RETURN_IF_ERROR(ReadString(extra, "dtype", where, &t.dtype));
  RETURN_IF_ERROR(ReadString(extra, "init_from", where, &t.init_from));
  if (auto it = extra.find("loss_scale"); it != extra.end() && !it->is_null()) {
    if (!it->is_number() || !std::isfinite(it->get<double>()) || !(it->get<double>() > 0)) {
      return Bad(where, "loss_scale", *it, "a positive finite scale");
    }
    t.loss_scale = it->get<double>();
    n.reset();
    RETURN_IF_ERROR(ReadCount(extra, "loss_scale_good_steps", where, &n));
    t.loss_scale_good_steps = n.value_or(0);
  }
  RETURN_IF_ERROR(ReadCount(extra, "data_cursor", where, &t.data_cursor));
  RETURN_IF_ERROR(ReadCount(extra, "adam_steps", where, &t.adam_steps));
  return t;
}

absl::StatusOr<model::LlamaConfig> TrainingState::ModelConfig(const std::string& where) const {
  if (!model_config) return absl::DataLossError(absl::StrCat(where, ": no model_config"));
  return *model_config;
}

TrainingState TrainingStateOf(const spec::JobSpec& spec, const model::LlamaConfig& config,
                              int64_t sp, int64_t dp, const LossScaler& scaler) {
  TrainingState t;
  t.seed = spec.seed;
  t.sp_degree = sp;
  t.dp_degree = dp;
  t.model_config = config;
  t.dtype = spec.model.dtype;
  // The HF model the job started from, absolute: `ulysses-train export` copies its tokenizer.
  if (!spec.model.init_from.empty()) {
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(spec.model.init_from, ec);
    t.init_from = ec ? spec.model.init_from : abs.lexically_normal().string();
  }
  if (scaler.enabled) {
    t.loss_scale = scaler.scale;
    t.loss_scale_good_steps = scaler.good_steps;
  }
  return t;
}

void RestoreLossScale(const TrainingState& training, LossScaler& scaler) {
  if (!scaler.enabled || !training.loss_scale) return;
  scaler.scale = *training.loss_scale;
  scaler.good_steps = training.loss_scale_good_steps;
}

}  // namespace ulysses::engine::train
