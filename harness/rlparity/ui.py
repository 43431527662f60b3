"""The terminal every command prints to."""

from __future__ import annotations

import sys

from rich.console import Console

# Piped output (CI logs) gets a wide table instead of rich's 80-column default.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
STYLE = {"passed": "green", "failed": "bold red", "error": "bold magenta", "skipped": "yellow"}
