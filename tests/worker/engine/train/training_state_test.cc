// TrainingState (worker/engine/train/training_state.h), the typed checkpoint extra: what a save
// writes reads back equal; a checkpoint without the optional keys reads as their defaults; a
// key of the wrong kind or out of range is DataLoss naming the checkpoint, the key and the
// value; keys of a newer build are ignored.
#include "worker/engine/train/training_state.h"

#include <string>

#include <gtest/gtest.h>

#include "tests/testing/tiny_model.h"
#include "worker/engine/train/model_io.h"

namespace ulysses::engine::train {
namespace {

using json = nlohmann::json;

TEST(TrainingStateTest, WhatASaveWritesReadsBackEqual) {
  TrainingState t;
  t.seed = -3;
  t.sp_degree = 4;
  t.dp_degree = 2;
  t.model_config = ::ulysses::testing::TinyLlama();
  t.dtype = "bfloat16";
  t.init_from = "/models/llama";
  t.loss_scale = 1024.0;
  t.loss_scale_good_steps = 7;
  t.data_cursor = 96;
  t.adam_steps = 12;
  const json j = t.ToJson();
  for (const char* key : {"seed", "sp_degree", "dp_degree", "model_config", "dtype", "init_from",
                          "loss_scale", "loss_scale_good_steps", "data_cursor", "adam_steps"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  auto back = TrainingState::FromJson(j, "checkpoint c");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->seed, -3);
  EXPECT_EQ(back->sp_degree, 4);
  EXPECT_EQ(back->dp_degree, 2);
  ASSERT_TRUE(back->model_config.has_value());
  EXPECT_EQ(ModelConfigToJson(*back->model_config),
            ModelConfigToJson(::ulysses::testing::TinyLlama()));
  EXPECT_EQ(back->dtype, "bfloat16");
  EXPECT_EQ(back->init_from, "/models/llama");
  EXPECT_EQ(back->loss_scale, 1024.0);
  EXPECT_EQ(back->loss_scale_good_steps, 7);
  EXPECT_EQ(back->data_cursor, 96);
  EXPECT_EQ(back->adam_steps, 12);
  EXPECT_EQ(back->ToJson(), j);
}

TEST(TrainingStateTest, MissingKeysReadAsDefaultsAndNewerKeysAreIgnored) {
  auto t = TrainingState::FromJson(json{{"a_later_key", {1, 2}}}, "checkpoint c");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->model_config.has_value());
  EXPECT_TRUE(t->dtype.empty());
  EXPECT_FALSE(t->loss_scale.has_value());
  EXPECT_FALSE(t->data_cursor.has_value());
  EXPECT_FALSE(t->adam_steps.has_value());
  // Nothing optional is written that was not set.
  EXPECT_EQ(TrainingState{}.ToJson(), (json{{"seed", 0}, {"sp_degree", 0}, {"dp_degree", 0}}));
  auto config = t->ModelConfig("checkpoint c");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(config.status().message().find("checkpoint c: no model_config"), std::string::npos);
}

TEST(TrainingStateTest, AKeyOfTheWrongKindIsDataLossNamingItAndTheValue) {
  const std::vector<std::pair<json, std::string>> bad = {
      {json{{"data_cursor", -1}}, "extra.data_cursor: -1 is not an integer >= 0"},
      {json{{"adam_steps", 1.5}}, "extra.adam_steps: 1.5 is not an integer >= 0"},
      {json{{"dtype", 16}}, "extra.dtype: 16 is not a string"},
      {json{{"init_from", false}}, "extra.init_from: false is not a string"},
      {json{{"loss_scale", 0}}, "extra.loss_scale: 0 is not a positive finite scale"},
      {json{{"loss_scale", 8.0}, {"loss_scale_good_steps", "x"}},
       "extra.loss_scale_good_steps: \"x\" is not an integer >= 0"},
      {json{{"seed", "s"}}, "extra.seed: \"s\" is not an integer"},
      {json{{"model_config", {{"hidden_size", "wide"}}}}, "extra.model_config: "},
      {json::array(), "extra: [] is not an object"}};
  for (const auto& [extra, want] : bad) {
    auto t = TrainingState::FromJson(extra, "checkpoint /c/step-00000003");
    ASSERT_FALSE(t.ok()) << extra.dump();
    EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss) << extra.dump();
    EXPECT_NE(t.status().message().find("checkpoint /c/step-00000003 " + want), std::string::npos)
        << t.status().message();
  }
}

}  // namespace
}  // namespace ulysses::engine::train
