"""The sampling family of the exact tier: its kernels (C++/CUDA/HIP), operators (ops.py), numpy reference
(reference.py), checks (checks.py) and golden digests (golden.json)."""
