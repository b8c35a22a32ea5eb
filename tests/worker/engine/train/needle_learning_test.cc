// Learning test: the real ulysses-train binary trains configs/jobs/needle-retrieval.yaml
// (a short-context stage, then 1k -> 2k -> 4k at sp 1 -> 2 -> 4, real processes over
// Gloo) from scratch, and the model must actually learn the needle task:
//   - the training loss falls (first vs last steps of the first stage);
//   - every stage's eval (retrieval accuracy over the validation needles at that
//     stage's length) is far above chance, and its loss far below the no-retrieval
//     floor ln(M).
// The run is deterministic (seeded data, init and all-reduce order), so the bounds are
// not flaky; they sit well inside what the run reaches (see docs/ENGINE.md).
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file_tree.h"
#include "tests/testing/trainer.h"
#include "worker/engine/data/dataset.h"

namespace ulysses {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

TEST(NeedleLearningTest, RetrievalRisesFarAboveChanceAtEveryStage) {
  const std::string spec = ::ulysses::testing::SourceDir() + "/configs/jobs/needle-retrieval.yaml";
  const fs::path dir = fs::temp_directory_path() / ("needle_learning_" + std::to_string(getpid()));
  ulysses::RemoveTree(dir).IgnoreError();
  fs::create_directories(dir);
  const ::ulysses::testing::Result train = ::ulysses::testing::RunTrainer(
      {"train", "-f", spec, "--out", (dir / "out").string()}, std::chrono::minutes(24));
  ASSERT_EQ(train.exit_code, 0) << train.description << "\n" << train.out << train.err;

  std::ifstream metrics(dir / "out" / "metrics.jsonl");
  ASSERT_TRUE(metrics.good());
  std::map<int, std::vector<double>> losses;  // stage -> per-step training loss
  std::map<int, json> evals;                  // stage -> its end-of-stage eval event
  for (std::string line; std::getline(metrics, line);) {
    const json j = json::parse(line);
    if (j.contains("eval")) {  // {"eval": {"stage", "seq_len", "loss", "accuracy", "tokens"}}
      evals[j["eval"].at("stage").get<int>()] = j["eval"];
    } else if (j.contains("loss")) {
      losses[j.at("stage").get<int>()].push_back(j.at("loss").get<double>());
    }
  }
  ASSERT_EQ(evals.size(), 4u) << train.out << train.err;

  // The loss falls: mean of the last 50 steps of stage 0 well under its first 50.
  const std::vector<double>& first = losses[0];
  ASSERT_GE(first.size(), 100u);
  double head = 0, tail = 0;
  for (size_t i = 0; i < 50; ++i) {
    head += first[i] / 50;
    tail += first[first.size() - 1 - i] / 50;
  }
  EXPECT_LT(tail, 0.25 * head) << "training loss did not fall: " << head << " -> " << tail;

  // The job's vocabulary (256) gives 8 keys with 14 values each: chance accuracy is 1/14,
  // and a model that does not retrieve cannot beat a loss of ln 14 = 2.64 on the answers.
  const int64_t m = engine::NeedleLayout::For(256).values_per_key;
  ASSERT_EQ(m, 14);
  const double chance = 1.0 / m, floor_loss = std::log(static_cast<double>(m));
  const std::vector<int64_t> lengths = {128, 1024, 2048, 4096};
  for (int stage = 0; stage < 4; ++stage) {
    const json& e = evals[stage];
    SCOPED_TRACE(e.dump());
    EXPECT_EQ(e.at("seq_len").get<int64_t>(), lengths[stage]);
    EXPECT_GT(e.at("accuracy").get<double>(), 8 * chance);  // > 0.57
    EXPECT_LT(e.at("loss").get<double>(), 0.5 * floor_loss);
  }
  ulysses::RemoveTree(dir).IgnoreError();
}

}  // namespace
}  // namespace ulysses
