"""Where a cell runs: base.py (the protocol and everything both backends share), local.py (a process per
cell), docker.py (a container per cell)."""
