"""Bitwise self-check of the rl_kernel build on the devices this machine has.

    python -m rl_kernel.contract.selfcheck [--tier exact|fast] [--family softmax|decoder] [--vocabs 7,257,...]
                                  [--require-gpu] [--json PATH]

For every vocabulary size and dtype of the tier (rl_kernel.tiers): run-to-run equality, batch invariance
(a row alone, the batch reversed, each family's invariance_checks), and, where the tier has a CPU
reference and a CUDA/ROCm device with the GPU build is present, CPU bits == GPU bits for every output and
gradient of every operator (the tier's checks package). A tier without a CPU reference (fast) is checked
on the GPU alone: run to run, batch invariance, and accuracy against float64 (OpSpec.reference). Prints a
table and the counts by kind; exits 1 on any mismatch.

On a machine without a GPU it compares nothing across devices, and says so: its
comparisons are then CPU run-to-run and batch/order only, and "0 CPU-vs-GPU
comparisons" is printed (and recorded in --json) so that a CPU-only pass is never
read as device parity.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

import torch

import rl_kernel
from rl_kernel import bitwise, inputs, tiers
from rl_kernel.contract.families import Case, OpSpec, all_specs, families
from rl_kernel.tiers import Tier

#: The kinds of comparison, in the order they are reported.
KINDS = ("cpu_vs_gpu", "run_to_run", "batch", "accuracy")
KIND_LABELS = {"cpu_vs_gpu": "CPU vs GPU", "run_to_run": "run to run", "batch": "batch/order", "accuracy": "vs float64"}


def kind_of(check: str) -> str:
    """What a check compares: CPU bits against GPU bits, a run against its repeat, the error against float64,
    or batch/order invariance."""
    if check.endswith("cpu == gpu"):
        return "cpu_vs_gpu"
    if check.endswith("run-to-run"):
        return "run_to_run"
    if check.endswith("vs float64"):
        return "accuracy"
    return "batch"


@dataclass(frozen=True)
class Accuracy:
    """An output's relative error against its float64 reference, within the operator's bound: a check that
    is not bitwise (a tier without a CPU reference has no exact bits to hold a GPU to)."""

    error: float
    bound: float

    @property
    def equal(self) -> bool:  # read as "passed" where the bitwise Diffs are read
        return self.error <= self.bound

    def summary(self) -> str:
        return f"relative error {self.error:.3g} > bound {self.bound:.3g}"


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN when either holds a NaN: never within a bound)."""
    out, ref = out.double().cpu(), ref.double().cpu()
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-300))


def _table(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A plain-text table (rl_kernel depends on torch and numpy only: no rich)."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = [title, "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def outputs(case: Case, specs: tuple[OpSpec, ...]) -> dict[str, torch.Tensor]:
    """Every forward output and gradient of the given operators on one case, moved to the CPU."""
    res = {}
    for spec in specs:
        if spec.differentiable:
            res[spec.name], res[f"{spec.name}.grad"] = spec.output_and_grad(case)
        else:
            res[spec.name] = spec.output(case)
    return {k: v.cpu() for k, v in res.items()}


def family_cases(
    vocab: int, dtype: torch.dtype, seed: int, only: frozenset[str] | None = None, tier: Tier | None = None
) -> dict[str, tuple[tuple[OpSpec, ...], Case]]:
    """Per case function (one per family, or more where a family's operators take different inputs): its
    operators and its random case (on the CPU), keyed "<family>" or "<family>/<case>". Operators with
    their own sizes (OpSpec.sizes) take part only at those sizes."""
    grouped: dict[tuple[str, object], list[OpSpec]] = {}
    for spec in all_specs(tier or tiers.get("exact")):
        if (only is None or spec.family in only) and (spec.sizes is None or vocab in spec.sizes):
            grouped.setdefault((spec.family, spec.check_case), []).append(spec)
    per_family: dict[str, int] = {}
    for family, _ in grouped:
        per_family[family] = per_family.get(family, 0) + 1
    return {
        (fam if per_family[fam] == 1 else f"{fam}/{fn.__name__}"): (
            tuple(specs),
            specs[0].check_case(vocab, dtype, seed),
        )
        for (fam, fn), specs in grouped.items()
    }


def _batch_checks(case: Case, dev: torch.device) -> dict[str, bitwise.Diff]:
    """token_logprobs of a row alone and of the reversed batch equal the batch's, on dev."""
    xs, ts = case.logits.to(dev), case.tokens.to(dev)
    full = rl_kernel.token_logprobs(xs, ts).cpu()
    alone = rl_kernel.token_logprobs(xs[3:4].clone(), ts[3:4]).cpu()
    rev = rl_kernel.token_logprobs(xs.flip(0), ts.flip(0)).flip(0).cpu()
    return {
        f"token_logprobs {dev.type} row alone == in batch": bitwise.diff(alone, full[3:4]),
        f"token_logprobs {dev.type} reversed batch": bitwise.diff(rev, full),
    }


def family_invariance_checks(
    vocab: int, dtype: torch.dtype, dev: torch.device, only: frozenset[str] | None = None, tier: Tier | None = None
) -> dict[str, bitwise.Diff]:
    """Each family's own batch/order checks (a module's invariance_checks(size, dtype, device)), for the
    families that take part at this size."""
    found: dict[str, bitwise.Diff] = {}
    for name, module in families(tier or tiers.get("exact")).items():
        if only is not None and name not in only:
            continue
        hook = getattr(module, "invariance_checks", None)
        if hook is not None and any(s.sizes is None or vocab in s.sizes for s in module.SPECS):
            found |= hook(vocab, dtype, dev)
    return found


def check_case(
    vocab: int, dtype: torch.dtype, gpu: bool, only: frozenset[str] | None = None, tier: Tier | None = None
) -> dict:
    tier = tier or tiers.get("exact")
    cases = family_cases(vocab, dtype, seed=vocab, only=only, tier=tier)
    dev = torch.device("cuda") if gpu else torch.device("cpu")
    if tier.cpu_reference:
        checks, cpu = reference_checks(cases, dev, gpu)
    else:
        checks, cpu = device_checks(cases, dev)
    if "softmax" in cases and "token_logprobs" in tier.operators:
        checks |= _batch_checks(cases["softmax"][1], dev)
    checks |= family_invariance_checks(vocab, dtype, dev, only, tier)
    first_case = next(iter(cases.values()))[1] if cases else None
    return {
        "vocab": vocab,
        "dtype": str(dtype).replace("torch.", ""),
        "rows": first_case.logits.shape[0] if first_case is not None else 0,
        "checks": len(checks),
        "by_kind": {kind: sum(kind_of(k) == kind for k in checks) for kind in KINDS},
        "mismatches": {k: d.summary() for k, d in checks.items() if not d.equal},
        "digest_token_logprobs": bitwise.digest(cpu["token_logprobs"]) if "token_logprobs" in cpu else None,
    }


def reference_checks(cases: dict, dev: torch.device, gpu: bool) -> tuple[dict, dict[str, torch.Tensor]]:
    """A tier with a CPU reference: CPU run to run and, with a GPU, CPU bits == GPU bits and GPU run to run."""
    cpu: dict[str, torch.Tensor] = {}
    checks: dict[str, bitwise.Diff | Accuracy] = {}
    for specs, case in cases.values():
        first, again = outputs(case, specs), outputs(case, specs)
        cpu |= first
        checks |= {f"{k} cpu run-to-run": bitwise.diff(first[k], again[k]) for k in first}
    if gpu:
        for specs, case in cases.values():
            on_gpu = case.to(dev)
            g1, g2 = outputs(on_gpu, specs), outputs(on_gpu, specs)
            for k in g1:
                checks[f"{k} cpu == gpu"] = bitwise.diff(cpu[k], g1[k])
                checks[f"{k} gpu run-to-run"] = bitwise.diff(g1[k], g2[k])
    return checks, cpu


def device_checks(cases: dict, dev: torch.device) -> tuple[dict, dict[str, torch.Tensor]]:
    """A tier without a CPU reference, on its device: run to run, and each output's error against its float64
    reference (OpSpec.reference) within the operator's bound."""
    out: dict[str, torch.Tensor] = {}
    checks: dict[str, bitwise.Diff | Accuracy] = {}
    for specs, case in cases.values():
        on_dev = case.to(dev)
        first, again = outputs(on_dev, specs), outputs(on_dev, specs)
        out |= first
        checks |= {f"{k} {dev.type} run-to-run": bitwise.diff(first[k], again[k]) for k in first}
        for spec in specs:
            if spec.reference is not None:
                err = relative_error(first[spec.name], spec.reference(case))
                checks[f"{spec.name} {dev.type} vs float64"] = Accuracy(err, spec.tolerance)
    return checks, out


def summary_lines(gpu: bool, totals: dict[str, int], equal: dict[str, int]) -> list[str]:
    """The closing lines: counts split by kind; without a GPU, a plain statement that no device was compared."""
    total, same = sum(totals.values()), sum(equal.values())
    if not gpu:
        return [
            f"CPU only: {same}/{total} run-to-run/batch comparisons equal "
            f"({equal['run_to_run']}/{totals['run_to_run']} run to run, "
            f"{equal['batch']}/{totals['batch']} batch/order); "
            "0 CPU-vs-GPU comparisons: no GPU here, so this says nothing about device parity"
        ]
    split = ", ".join(f"{KIND_LABELS[k]} {equal[k]}/{totals[k]}" for k in KINDS if totals.get(k))
    return [f"{same}/{total} comparisons bitwise equal: {split}"]


def run_sizes(vocabs: str | None, only: frozenset[str] | None, tier: Tier | None = None) -> list[int]:
    """The sizes to run: --vocabs, else the vocabularies (for families without sizes of their own) and
    every chosen family's sizes, in increasing order."""
    if vocabs:
        return [int(v) for v in vocabs.split(",")]
    chosen = [s for s in all_specs(tier or tiers.get("exact")) if only is None or s.family in only]
    sizes = {v for s in chosen for v in (s.sizes or inputs.VOCABS)}
    return sorted(sizes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="bitwise self-check of rl_kernel")
    ap.add_argument("--tier", default="exact", choices=sorted(tiers.tiers()), help="the tier (default exact)")
    ap.add_argument("--vocabs", default=None, help="comma-separated vocabulary sizes (default: every family's)")
    ap.add_argument("--family", action="append", help="only this family (repeatable; default all)")
    ap.add_argument("--require-gpu", action="store_true", help="fail when no GPU build and device are present")
    ap.add_argument("--json", help="write the records here")
    args = ap.parse_args(argv)
    tier = tiers.get(args.tier)
    known = sorted(families(tier))
    if args.family and set(args.family) - set(known):
        ap.error(f"unknown family for the {tier.name} tier: {', '.join(sorted(set(args.family) - set(known)))} "
                 f"(known: {', '.join(known)})")  # fmt: skip
    gpu = torch.cuda.is_available() and rl_kernel.has_gpu_kernels()
    if args.require_gpu and not gpu:
        print("selfcheck: --require-gpu, but no CUDA/ROCm device with the GPU build is available", file=sys.stderr)
        return 2
    if not tier.cpu_reference and not gpu:
        print(f"selfcheck: the {tier.name} tier has no CPU kernels and this machine has no GPU: nothing checked")
        return 0
    device = torch.cuda.get_device_name() if gpu else "cpu only (no CUDA/ROCm device here)"
    devices = f"cpu + {device}" if gpu else f"{device}: nothing is compared across devices"
    if not tier.cpu_reference:
        devices = f"{device} (no CPU reference: run to run, batch invariance and accuracy against float64)"
    print(f"rl_kernel {tier.name} tier, torch {torch.__version__}, devices: {devices}", flush=True)
    rows, records = [], []
    only = frozenset(args.family) if args.family else None
    dtypes = [d for d in inputs.DTYPES if inputs.dtype_name(d) in tier.dtypes]
    for vocab in run_sizes(args.vocabs, only, tier):
        for dtype in dtypes:
            t0 = time.perf_counter()
            rec = check_case(vocab, dtype, gpu, only, tier)
            rec["seconds"] = round(time.perf_counter() - t0, 2)
            records.append(rec)
            bad = len(rec["mismatches"])
            rows.append(
                (str(vocab), rec["dtype"], str(rec["rows"]), str(rec["checks"]), str(bad), f"{rec['seconds']:.2f}")
            )
            for k, s in rec["mismatches"].items():
                print(f"MISMATCH V={vocab} {rec['dtype']}: {k}: {s}", flush=True)
    header = ("vocab", "dtype", "rows", "comparisons", "mismatches", "seconds")
    print(_table("bitwise self-check", header, rows))
    failed = sum(len(r["mismatches"]) for r in records)
    totals = {kind: sum(r["by_kind"][kind] for r in records) for kind in KINDS}
    equal = {kind: totals[kind] - sum(kind_of(k) == kind for r in records for k in r["mismatches"]) for kind in KINDS}
    for line in summary_lines(gpu, totals, equal):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "tier": tier.name,
                    "device": device,
                    "torch": torch.__version__,
                    "cuda": torch.version.cuda,
                    "hip": torch.version.hip,
                    "gpu": gpu,
                    "comparisons": totals,
                    "equal": equal,
                    "cases": records,
                },
                f,
                indent=1,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
