"""The divergence locator (rl_kernel.locate is its face and command line): which module of a model is the first where
two paths' outputs part. paths.py runs and records the paths; report.py says what was found."""

from __future__ import annotations

from rl_kernel.locator.paths import Recorder, display, first_tensor, layer_list, locate, locate_paths, ulp_distance
from rl_kernel.locator.report import LABELS, ROOT, LayerShare, ModuleResult, Report

__all__ = [
    "LABELS",
    "ROOT",
    "LayerShare",
    "ModuleResult",
    "Recorder",
    "Report",
    "display",
    "first_tensor",
    "layer_list",
    "locate",
    "locate_paths",
    "ulp_distance",
]
