// Element types of the operators' inputs and outputs: storage and the exact
// conversions of numerics.h (load widens, store rounds to nearest even).
#pragma once

#include "numerics.h"

namespace rl {

// ---- element types: storage and exact conversion to binary32 ---------------
struct F32 {
  using storage = float;
  RL_HD static float load(const storage* p, int64_t i) { return p[i]; }
  RL_HD static storage store(float x) { return x; }
};
struct BF16 {
  using storage = uint16_t;
  RL_HD static float from_bits(uint16_t h) { return from_bf16_bits(h); }
  RL_HD static float load(const storage* p, int64_t i) { return from_bits(p[i]); }
  RL_HD static storage store(float x) { return to_bf16_bits(x); }
};
struct F16 {
  using storage = uint16_t;
  RL_HD static float from_bits(uint16_t h) { return from_f16_bits(h); }
  RL_HD static float load(const storage* p, int64_t i) { return from_bits(p[i]); }
  RL_HD static storage store(float x) { return to_f16_bits(x); }
};

}  // namespace rl
