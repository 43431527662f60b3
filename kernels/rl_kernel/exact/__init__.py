"""The exact tier's descriptor (tier.py). Its code is where it has always been: the operators in rl_kernel.ops,
the kernels in csrc/, the numpy transcription in reference/, the checks in rl_kernel.checks and the golden
digests in golden/exact/."""
