"""The fast tier's decoder family: the Triton linear (linear.py) and attention (attention.py) kernels, the RMSNorm
with a parallel weight gradient (norm.py), their checks (checks.py) and the per-target golden digests (golden/)."""
