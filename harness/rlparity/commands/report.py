"""`rlparity report`: the subcommand is rlparity.report.command (the report package owns its command line, so that
`python -m rlparity.report` and `rlparity report` are one piece of code)."""

from __future__ import annotations

from rlparity.report.command import register

__all__ = ["register"]
