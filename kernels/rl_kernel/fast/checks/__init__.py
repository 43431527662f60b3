"""The fast tier's checks (rl_kernel.checks walks this package): one module per family, with SPECS whose
`reference` is the float64 result selfcheck holds the GPU to, and invariance_checks."""
