"""The bitwise suite a cell runs (pytest): rollout vs training, batch invariance, run-to-run, golden
digests, the split placement, and an informational stock-PyTorch control. See plugin.py for how a cell
hands it its parameters and collects what it compared."""
