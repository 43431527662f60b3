// The decoder family (docs/numerics.md section 11): linear, RMSNorm, rotary embedding, SiLU x up and
// causal grouped-query attention, each as the contract's per-element or per-row function (used by the
// CPU executor, decoder_cpu.cpp) and, beside it, the GPU kernel that computes the same function in the
// same order (decoder_gpu.cu launches them): one header per operator, scalar.cuh their shared rules.
// No ATen here: kernels-check compiles this file alone (decoder_check.cu) for every GPU target.
#pragma once

#include "linear.cuh"
#include "norm.cuh"
#include "rope.cuh"
#include "swiglu.cuh"
#include "attention.cuh"
