// The small Llama shape the engine tests build: fast on a CPU, with fewer kv heads than
// heads so grouped-query attention is exercised, and heads divisible by SP 1, 2 and 4.
// Tests that need another size start from it and change the fields they need.
#ifndef ULYSSES_TESTS_TESTING_TINY_MODEL_H_
#define ULYSSES_TESTS_TESTING_TINY_MODEL_H_

#include "common/spec/model_shape.h"

namespace ulysses::testing {

// vocab 64, hidden 32, intermediate 48, 2 layers, 4 heads, 2 kv heads, untied.
inline spec::ModelShape TinyLlama() {
  spec::ModelShape c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  return c;
}

}  // namespace ulysses::testing

#endif  // ULYSSES_TESTS_TESTING_TINY_MODEL_H_
