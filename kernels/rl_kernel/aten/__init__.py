"""rl_kernel.mode(tier): aten's operators served by a tier's kernels, for a model rl_kernel never patched.

mode: the mode itself (enable / disable / mode, the audit); ops: the servers of the matrix products, the experts'
grouped GEMM, top-k and the scatter-adds; norms: RMSNorm served whole; masks: SDPA's mask as key ranges; positions:
the forward's positions against the mask's; tree: the fixed-order sums behind the served reductions."""
