"""What runs inside a cell (a fresh process or container): cellrun, the bitwise suite, the workloads, the
negative controls, the placements, and the torch/rl_kernel side of the fingerprint, inventory, golden
digests and tensor comparison. The host (everything else in rlparity) never imports this package:
pyproject.toml's import-linter contracts enforce it (tests/harness/test_layering.py)."""
