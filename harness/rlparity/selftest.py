"""`rlparity selftest`: the negative controls, and (--mutations) mutation testing of the gate.

Each deliberately wrong kernel (rlparity.cell.controls) runs as a real cell through the local backend and
must be caught by the comparison it targets (EXPECTED): a control caught only by some other comparison
means its own detector could be vacuous, so it counts as missed. The unmodified kernel must pass. Two
controls break a property only the gate sees across cells (profile-variant, placement-variant): they run
as a pair of cells, and the gate's digest_disagreements over the pair must flag them.

Each tier's own negative controls (its descriptor's `controls`, reported by the device probe: the fast tier's
split-K linear, or a tier of your package's) run the quick matrix's cells of that tier that can run on this host,
with the tier's control variable set; the gate must fail (exit 1) for every one. A control none of whose cells can
run here (the fast tier on a machine without a GPU) is reported as not applicable, with the reason.

--mutations: the kernel engineer's mutated build of rl_kernel (RL_MUTATIONS compile-time points chosen
at run time by RL_KERNEL_MUTATION) runs the quick gate's representative CPU cells once per mutation;
the gate must fail (exit 1) for every one. A harness that cannot fail proves nothing.

Every cell runs through the runner (rlparity.runner.run_cells), as `rlparity run` runs them: selftest only chooses
the cells and the env, and reads the verdicts.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlparity import gate, results
from rlparity.applicability import skip_reason
from rlparity.backends.local import LocalBackend
from rlparity.cells import CONTROLS, Cell
from rlparity.config import ConfigError
from rlparity.inventory import Inventory
from rlparity.matrix import Workload, load_axes, load_matrix
from rlparity.runner import run_cells

NEGATIVE = CONTROLS[1:]

# The gated comparisons, by the suite's test that makes them (cell/suite/test_bitwise.py), plus the two
# the gate makes across cells (gate.digest_disagreements).
COMPARISON_OF_TEST = {
    "test_rollout_matches_training": "rollout-vs-training",
    "test_batch_invariance": "batch-invariance",
    "test_run_to_run": "run-to-run",
    "test_golden_digests": "golden",
    "test_split_matches_single": "split",
    "test_vocab_slices_match_single": "vocab-slices",
    "test_token_contract": "token-contract",
}
ACROSS_PROFILES, ACROSS_PLACEMENTS = "across-profiles", "across-placements"
COMPARISONS = (*COMPARISON_OF_TEST.values(), ACROSS_PROFILES, ACROSS_PLACEMENTS)
# The tier the negative controls break: each control is a violation of the exact tier's contract (its tree,
# its rounding, its FMA rule), so selftest proves the suite against that tier's cells.
CONTROLLED_TIER = "exact"

# Control -> the comparison(s) that must catch it (every one listed). Others may catch it too.
EXPECTED: dict[str, tuple[str, ...]] = {
    "ulp-flip": ("rollout-vs-training", "batch-invariance", "golden"),
    "reversed-order": ("golden",),
    "fma-build": ("golden",),
    "wave-tree": ("golden",),
    "atomics": ("run-to-run",),
    "batch-variant": ("batch-invariance",),
    "rollout-variant": ("rollout-vs-training",),
    "profile-variant": (ACROSS_PROFILES,),
    "placement-variant": (ACROSS_PLACEMENTS, "split"),
    "range-unchecked": ("token-contract",),
    "rank-order": ("vocab-slices",),
}
# Controls run as a pair: the baseline cell and one that differs on this axis (value per platform).
PAIRED: dict[str, tuple[str, dict[str, str]]] = {
    "profile-variant": ("profile", {"cpu": "threads-1", "cuda": "cublas-workspace", "rocm": "sdma-off"}),
    "placement-variant": ("placement", {"cpu": "split", "cuda": "split", "rocm": "split"}),
}
ACROSS = {"profile": ACROSS_PROFILES, "placement": ACROSS_PLACEMENTS}

# The one place the mutated library is built: the kernel engineer's builder prints its path on stdout
# (its last line). The mutation names come from rl_kernel.build_flags.mutation_names().
MUTATION_BUILDER = ("-m", "rl_kernel.contract.mutations", "build")
MUTATION_NAMES = ("-c", "import json, rl_kernel.build_flags as b; print(json.dumps(list(b.mutation_names())))")
# Mutations no output can show, each with the guard that stands in (rl_kernel.build_flags.EQUIVALENT_MUTATIONS):
# one that passes the gate is reported as equivalent, not missed; a test keeps this equal to the kernel's.
EQUIVALENT_MUTATIONS = {"max_no_nan": "kernels_check's NaN-dropping max/min rule (no output can show it)"}
# The representative cells (baseline profile, single placement): every dtype of these shape sets...
MUTATION_SHAPES = ("edges",)
MUTATION_PLAIN = ("quick", "fp32")  # ...plus one cell of the plain quick shapes


@dataclass(frozen=True)
class ControlOutcome:
    control: str
    status: str
    caught: bool  # caught by every expected comparison (for "none": the kernel passed)
    caught_by: tuple[str, ...]  # the gated comparisons (COMPARISONS) that differed
    reason: str
    expected: tuple[str, ...] = ()
    differed: tuple[str, ...] = ()  # the names of the differing comparisons, for the log
    applicable: bool = True  # False: its cells cannot run on this host (reason says why); neither caught nor missed

    @property
    def ok(self) -> bool:
        return self.caught or not self.applicable


def comparison_of(test: str) -> str:
    """The gated comparison a suite test's comparison belongs to ('test_x[2x64x32000]' -> its name)."""
    base = test.split("[", 1)[0]
    return COMPARISON_OF_TEST.get(base, base)


def caught_by(res: results.CellResult) -> tuple[str, ...]:
    """The gated comparisons that differed in one cell, in COMPARISONS order."""
    hit = {comparison_of(c["test"]) for c in res.gated if not c["equal"]}
    return tuple(c for c in COMPARISONS if c in hit) + tuple(sorted(hit - set(COMPARISONS)))


def selftest_cell(
    shapes: str = "selftest",
    dtype: str = "fp32",
    timeout_s: float = 600.0,
    target: str = "cpu",
    profile: str = "baseline",
    placement: str = "single",
) -> Cell:
    axes = load_axes()
    if target not in axes.targets:
        raise ConfigError(f"unknown target {target!r} (known: {', '.join(axes.targets)})")
    t = axes.targets[target]
    w = axes.workloads.get(shapes, Workload())
    return Cell(
        image="local",
        target=target,
        profile=profile,
        placement=placement,
        dtype=dtype,
        shapes=shapes,
        tier=CONTROLLED_TIER,
        tier_scope=axes.tiers[CONTROLLED_TIER].scope,
        platform=t.platform,
        arch=t.arch,
        env=axes.profiles[profile].env_for(target),
        shape_list=axes.shapes[shapes],
        workload=w.name,
        params=w.params,
        timeout_s=timeout_s,
        repeats=3,
    )


def outcome(control: str, res: results.CellResult, across: tuple[str, ...] = ()) -> ControlOutcome:
    """Whether a control was caught by the comparisons it targets (`across`: those the gate flagged
    across a pair of cells). The unmodified kernel is 'caught' when it passes."""
    differed = tuple(c["name"] for c in res.gated if not c["equal"])
    by = caught_by(res) + tuple(a for a in across if a not in caught_by(res))
    expected = EXPECTED.get(control, ())
    if control == "none":
        caught = res.status == "passed" and not across
    else:
        failed = res.status == "failed" and bool(differed)
        caught = (failed or bool(across)) and res.status != "error" and all(e in by for e in expected)
    return ControlOutcome(control, res.status, caught, by, res.reason, expected, differed)


def not_applicable(control: str, reason: str) -> ControlOutcome:
    """A control whose cells cannot run on this host: reported with the reason, never counted as caught."""
    return ControlOutcome(control, "skipped", False, (), reason, EXPECTED.get(control, ()), applicable=False)


def across_cells(pair: list[results.CellResult], axis: str) -> tuple[str, ...]:
    """The gate's cross-cell digest comparison over a control's pair of cells. digest_disagreements leaves
    control cells out of real runs, so the pair is handed to it as the plain cells they stand in for."""
    plain = [dataclasses.replace(r, variant="none") for r in pair]
    return (ACROSS[axis],) if gate.digest_disagreements(plain) else ()


def run(out: Path, controls: tuple[str, ...] = CONTROLS, on_result=None, target: str = "cpu") -> list[ControlOutcome]:
    """Each control as a cell of `target` (cpu, or this host's GPU target: the controls then run on it)."""
    backend = LocalBackend()
    cell = selftest_cell(target=target)
    gpu = cell.platform != "cpu"
    inventory = backend.probe()
    if gpu:
        reason = skip_reason(cell, inventory)
        if reason:
            raise ConfigError(f"selftest --target {target}: {reason}")
    outcomes = []
    for v in controls:
        env = backend.control_env(v, gpu=gpu)
        if v in PAIRED:
            axis, value = PAIRED[v]
            other = selftest_cell(target=target, **{axis: value[cell.platform]})
            reason = skip_reason(other, inventory) if gpu else None
            if reason:  # e.g. split on a host with one GPU: the pair cannot run here
                outcomes.append(not_applicable(v, reason))
            else:
                base = _run_one(backend, inventory, cell, out / f"{v}.baseline", v, env)
                res = _run_one(backend, inventory, other, out / v, v, env)
                outcomes.append(outcome(v, res, across_cells([base, res], axis)))
        else:
            outcomes.append(outcome(v, _run_one(backend, inventory, cell, out / v, v, env)))
        if on_result:
            on_result(outcomes[-1])
    return outcomes


def _run_one(
    backend: LocalBackend, inventory: Inventory, cell: Cell, out: Path, control: str, env
) -> results.CellResult:
    """One control cell through the runner; its result is also kept at `out` itself (result.json), where the
    selftest log and the tests read it."""
    (res,) = run_cells([cell], backend, out, inventory, control=control, extra_env=env)
    results.write(res, out)
    return res


# ---- a verdict of the gate over cells run with an env: mutations and tier controls ------------------------
@dataclass(frozen=True)
class GateOutcome:
    """The gate over the cells one mutated library, or one tier control, ran: it must say MISMATCH (exit 1)."""

    name: str  # the mutation, or the tier control as <tier>:<control>
    code: int  # the gate's exit code over the cells (1: caught)
    caught_by: tuple[str, ...]  # the gated comparisons that differed, across every cell
    reasons: tuple[str, ...]
    equivalent: str = ""  # a mutation no output can show: the guard that stands in for it
    applicable: bool = True  # False: none of its cells can run on this host (reasons say why)

    @property
    def caught(self) -> bool:
        return self.code == gate.MISMATCH

    @property
    def ok(self) -> bool:
        return self.caught or not self.applicable or (bool(self.equivalent) and self.code == gate.OK)


def gate_over(
    name: str, cells: list[Cell], backend: LocalBackend, inventory: Inventory, out: Path, env: dict[str, str]
) -> GateOutcome:
    """Run the cells with env through the runner and judge them as the gate does."""
    got = run_cells(cells, backend, out, inventory, extra_env=env)
    verdict = gate.decide(got)
    by = sorted(
        {k for r in got for k in caught_by(r)} | ({"across-cells"} if gate.digest_disagreements(got) else set())
    )
    return GateOutcome(name, verdict.code, tuple(by), verdict.reasons, EQUIVALENT_MUTATIONS.get(name, ""))


# ---- each tier's own negative controls ------------------------------------------------------------------
def tier_controls(inventory: Inventory) -> list[tuple[str, str, str]]:
    """(tier, control, the env variable that chooses it) for every control of every tier this installation
    offers (the probe's descriptors: rl_kernel.tiers.Tier.controls), in tier then control order."""
    found = []
    for tier, d in sorted(inventory.offered_tiers().items()):
        for control in d.get("controls", ()):
            found.append((tier, control, d.get("control_var", "RL_KERNEL_CONTROL")))
    return found


def tier_control_cells(tier: str, inventory: Inventory, matrix: str = "quick") -> tuple[list[Cell], str]:
    """The matrix's cells of a tier (baseline profile, single placement) that can run on this host, or none and
    the reason the first of them cannot."""
    mine = [c for c in load_matrix(matrix).cells if c.tier == tier and c.profile == "baseline"]
    mine = [c for c in mine if c.placement == "single"]
    if not mine:
        return [], f"the {matrix} matrix has no baseline/single cell of the {tier} tier"
    runnable = [c for c in mine if skip_reason(c, inventory) is None]
    return runnable, "" if runnable else f"no cell of the {tier} tier runs here: {skip_reason(mine[0], inventory)}"


def run_tier_controls(
    out: Path, only: tuple[str, ...] | None = None, matrix: str = "quick", on_result=None
) -> list[GateOutcome]:
    """Each tier control (<tier>:<control>; `only`: these) over the matrix's runnable cells of its tier: the gate
    must fail. One whose cells cannot run here is not applicable (neither caught nor missed)."""
    backend = LocalBackend()
    inventory = backend.probe()
    outcomes = []
    for tier, control, var in tier_controls(inventory):
        name = f"{tier}:{control}"
        if only is not None and name not in only:
            continue
        cells, reason = tier_control_cells(tier, inventory, matrix)
        if cells:
            outcomes.append(gate_over(name, cells, backend, inventory, out / name.replace(":", "-"), {var: control}))
        else:
            outcomes.append(GateOutcome(name, gate.OK, (), (reason,), applicable=False))
        if on_result:
            on_result(outcomes[-1])
    return outcomes


# ---- mutation testing of the gate ---------------------------------------------------------------------
def build_mutated_library(builder: Sequence[str] | None = None, gpu: bool = False) -> Path:
    """The mutated rl_kernel library (with its CUDA/HIP kernels when `gpu`), from rl_kernel's builder (its
    path: stdout's last line)."""
    argv = list(builder) if builder is not None else [sys.executable, *MUTATION_BUILDER, *(["--gpu"] if gpu else [])]
    proc = subprocess.run(argv, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not Path(lines[-1].strip()).is_file():
        raise ConfigError(
            f"building the mutated library ({' '.join(argv)}) failed (exit {proc.returncode}): "
            f"{(proc.stdout + proc.stderr).strip()[-2000:] or 'no output'}"
        )
    return Path(lines[-1].strip())


def mutation_names(names_cmd: Sequence[str] | None = None) -> list[str]:
    """rl_kernel.build_flags.mutation_names(), asked in a subprocess (the host never imports rl_kernel)."""
    argv = list(names_cmd) if names_cmd is not None else [sys.executable, *MUTATION_NAMES]
    proc = subprocess.run(argv, capture_output=True, text=True)
    try:
        names = json.loads(proc.stdout)
    except ValueError:
        names = None
    if proc.returncode != 0 or not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"listing the mutations ({' '.join(argv)}) failed: {(proc.stdout + proc.stderr)[-2000:]}")
    return names


def mutation_cells(matrix: str = "quick", target: str = "cpu") -> list[Cell]:
    """The quick gate's representative cells of `target`: baseline, single placement; each dtype of the edges
    shapes and the fp32 cell of the quick shapes."""
    picked = [
        c
        for c in load_matrix(matrix).cells
        if c.target == target
        and c.profile == "baseline"
        and c.placement == "single"
        and (c.shapes in MUTATION_SHAPES or (c.shapes, c.dtype) == MUTATION_PLAIN)
    ]
    if not picked:
        raise ConfigError(f"the {matrix} matrix has no baseline/single {target} cell of {', '.join(MUTATION_SHAPES)}")
    return picked


def run_mutations(
    out: Path,
    builder: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
    cells: list[Cell] | None = None,
    on_result: Callable[[GateOutcome], None] | None = None,
    target: str = "cpu",
) -> list[GateOutcome]:
    """Every mutation's gate over the representative cells of `target` (cpu, or this host's GPU target), the
    mutated library and the mutation set in each cell's env (as fma-build sets RL_KERNEL_LIBRARY)."""
    cells = cells if cells is not None else mutation_cells(target=target)
    gpu = any(c.platform != "cpu" for c in cells)
    backend = LocalBackend()
    inventory = backend.probe()
    if gpu:
        reason = skip_reason(cells[0], inventory)
        if reason:
            raise ConfigError(f"selftest --mutations --target {target}: {reason}")
    library = build_mutated_library(builder, gpu=gpu)
    names = list(names) if names is not None else mutation_names()
    outcomes = []
    for name in names:
        env = {"RL_KERNEL_LIBRARY": str(library), "RL_KERNEL_MUTATION": name}
        outcomes.append(gate_over(name, cells, backend, inventory, out / name, env))
        if on_result:
            on_result(outcomes[-1])
    return outcomes
