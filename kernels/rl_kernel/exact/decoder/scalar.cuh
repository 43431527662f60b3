// The decoder family's shared scalar rules (docs/numerics.md section 11): how an output element is rounded
// and stored, and the pair of values several operators return. Used by every operator header of the family.
#pragma once

#include "../common/dtypes.h"
#include "../common/gpu.h"

namespace rl {

// ---- shared scalar rules ----------------------------------------------------------------------
// An output element: canonical NaN, then rounded to D (round to nearest even).
template <class D>
RL_HD typename D::storage store_out(float x) {
  return D::store(canonical(x));
}

// x rounded to D and widened back (exact): the value a D tensor would hold.
template <class D>
RL_HD float rounded(float x) {
  const typename D::storage s = store_out<D>(x);
  return D::load(&s, 0);
}

// +0.0 for a zero of either sign, x otherwise: terms of a padded tree sum may never be -0.0 (-0 + 0 = +0).
RL_HD float no_neg_zero(float x) { return x + 0.0f; }

// Two values computed together (a rotated pair, the two gradients of SiLU x up, attention's (p, dS)).
struct Pair {
  float a, b;
};

}  // namespace rl
