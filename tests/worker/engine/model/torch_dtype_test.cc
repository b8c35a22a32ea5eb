#include "worker/engine/model/torch_dtype.h"

#include <set>
#include <string>

#include <gtest/gtest.h>

#include "common/spec/memory_model.h"
#include "worker/engine/model/llama.h"

namespace ulysses::engine {
namespace {

// One table (common/dtype.h): every entry maps to a distinct torch type of its size and back,
// names and safetensors codes are unique, and the spec and memory model read the same table.
TEST(DtypeTableTest, EveryEntryRoundTripsThroughTorchWithItsSize) {
  std::set<std::string_view> names, codes;
  std::set<torch::ScalarType> types;
  for (const DtypeInfo& d : kDtypes) {
    SCOPED_TRACE(std::string(d.name));
    EXPECT_TRUE(names.insert(d.name).second);
    EXPECT_TRUE(codes.insert(d.safetensors).second);
    const torch::ScalarType t = TorchType(d);
    EXPECT_TRUE(types.insert(t).second) << "two entries map to " << c10::toString(t);
    EXPECT_EQ(DtypeOf(t), &d);
    EXPECT_EQ(FindDtype(d.name), &d);
    EXPECT_EQ(FindSafetensorsDtype(d.safetensors), &d);
    EXPECT_EQ(static_cast<int>(c10::elementSize(t)), d.bytes);
    EXPECT_EQ(spec::DtypeBytes(std::string(d.name)), d.bytes);
    // spec.model.dtype takes exactly the weight dtypes.
    EXPECT_EQ(model::ParseDtype(std::string(d.name)).ok(), d.weight);
  }
  EXPECT_EQ(DtypeOf(torch::kComplexFloat), nullptr);
  EXPECT_EQ(FindDtype("float8"), nullptr);
  EXPECT_EQ(WeightDtypeList(), "float32, bfloat16, float16 or float64");
  EXPECT_EQ(WeightDtypeList(/*safetensors=*/true), "F32, BF16, F16 or F64");
}

}  // namespace
}  // namespace ulysses::engine
