"""bench/: one entry point (`python -m bench`), one timer (bench/timing.py), no harness internals, device-neutral
names, every module under 500 lines, and the RL-step benchmark runs end to end on the CPU at a tiny size."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
MODULES = sorted(BENCH.glob("*.py"))
# What the benchmarks the project relies on are called (docs/benchmarks.md names them).
NEEDED = {"model_step", "fused_head", "row", "token_logprobs", "decoder", "profile_decode", "gpu_parity", "fast_tier"}
TIMERS = ("perf_counter", "torch.cuda.Event", "elapsed_time", "do_bench", "CUDAGraph", "torch.profiler", "statistics")


def run_bench(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def defines_main(path: Path) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in ast.parse(path.read_text()).body)


def test_the_list_names_every_module_with_a_main_and_its_description() -> None:
    res = run_bench("--list")
    assert res.returncode == 0, res.stderr
    listed = dict(line.strip().split(None, 1) for line in res.stdout.splitlines() if line.strip())
    assert set(listed) == {p.stem for p in MODULES if not p.stem.startswith("_") and defines_main(p)}
    assert set(listed) >= NEEDED
    assert all(len(d) > 20 for d in listed.values()), listed


def test_an_unknown_benchmark_is_refused_naming_the_known_ones() -> None:
    res = run_bench("no_such_benchmark")
    assert res.returncode == 2
    assert "no benchmark 'no_such_benchmark'" in res.stderr and "model_step" in res.stderr


def test_every_benchmark_answers_help() -> None:
    """Each one's options parse before it needs a GPU (one process: torch is imported once)."""
    code = (
        "import contextlib, io, sys\n"
        "from bench.__main__ import benchmarks, main\n"
        "bad = []\n"
        "for name in benchmarks():\n"
        "    out = io.StringIO()\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(out):\n"
        "            main([name, '--help'])\n"
        "        bad.append((name, 'returned instead of exiting'))\n"
        "    except SystemExit as e:\n"
        "        if e.code not in (0, None) or 'usage:' not in out.getvalue():\n"
        "            bad.append((name, e.code))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_bench_imports_nothing_of_the_harness(path: Path) -> None:
    """The harness's internals change under it; bench builds on rl_kernel (models, integrations, tiers)."""
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        assert not any(n == "rlparity" or n.startswith("rlparity.") for n in names), (path.name, names)


@pytest.mark.parametrize("path", [p for p in MODULES if p.name != "timing.py"], ids=lambda p: p.name)
def test_only_timing_py_times(path: Path) -> None:
    text = path.read_text()
    found = [t for t in TIMERS if t in text.replace("torch.profiler's", "")]
    assert not found, f"{path.name} keeps a timer of its own ({found}): time through bench.timing"


def test_no_file_is_named_after_one_vendors_part() -> None:
    named = [p.name for p in BENCH.iterdir() if re.search(r"[hab]100|h200|b200|mi[23]\d\d|nvidia|amd", p.name, re.I)]
    assert not named


@pytest.mark.parametrize("path", [*MODULES, BENCH / "gpu_round.sh"], ids=lambda p: p.name)
def test_no_module_is_over_500_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 500


def test_the_round_script_parses_and_passes_shellcheck() -> None:
    script = str(BENCH / "gpu_round.sh")
    res = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    res = subprocess.run(["shellcheck", script], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_the_rl_step_runs_on_the_cpu_with_its_checks(tmp_path: Path) -> None:
    """model_step at the tiny shape: the exact tier's generate() logits equal the training forward's and every
    first-step ratio is exactly 1.0, the same for the unpatched model under rl_kernel.mode("exact") (mode-exact);
    stock's are compared over the same tokens (whether they agree depends on the CPU: on an AVX2-only EPYC its
    decode and prefill GEMMs round differently), and each was timed (bench.timing's CPU path)."""
    out = tmp_path / "step.json"
    sizes = ["--batch", "2", "--prompt-min", "3", "--prompt-max", "6", "--new", "3", "--train-batch", "2",
             "--train-len", "12", "--check-batch", "2", "--check-new", "3", "--reps", "1"]  # fmt: skip
    res = run_bench("model_step", "--model", "tiny", "--tiers", "stock,exact,mode-exact", *sizes, "--interleave", "2",
                    "--json", str(out))  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    record = json.loads(out.read_text())
    inter = record["interleaved_rollout"]  # each tier's rollout twice, in turn, and its paired ratio to stock's
    assert inter["rounds"] == 2 and all(len(v) == 2 and min(v) > 0 for v in inter["seconds"].values())
    assert inter["paired_over_stock"]["stock"] == 1.0 and inter["paired_over_stock"]["exact"] > 0
    steps = record["interleaved_training"]  # the training steps alike, each tier on its own copy of the weights
    assert set(steps["seconds"]) == {"stock", "exact", "mode-exact"} and steps["rounds"] == 2
    assert all(len(v) == 2 and min(v) > 0 for v in steps["seconds"].values())
    assert record["shape"]["layers"] == 2 and record["env"]["device"] == "cpu"
    stock = record["stock"]["check"]
    assert stock["tokens"] == 6 and stock["logits_compared"] == record["exact"]["check"]["logits_compared"] > 0
    for tier in ("exact", "mode-exact"):
        check = record[tier]["check"]
        assert check["generate_equals_forward"] and check["ratios_exactly_one"] == check["tokens"] == 6, check
        assert record[tier]["train"]["synced_s"] > 0 and record[tier]["rollout"]["queued_s"] > 0
    assert (
        record["exact"]["train_fused_head"]["synced_s"] > 0 and record["mode-exact"]["train_fused_head"]["synced_s"] > 0
    )
    assert record["mode-exact"]["train_synced_s_over_stock"] > 0


@pytest.mark.slow  # a model step in a subprocess
@pytest.mark.parametrize("model", ["tiny-moe", "tiny-window"])
def test_the_rl_step_of_a_mixture_of_experts_and_a_window_runs_under_the_mode(tmp_path: Path, model: str) -> None:
    """OLMoE's and Mistral's shapes in small: the default grouped experts; a window (16 keys) shorter than the
    training sequences (40) and than the checked ones, whose forward is right padded. Under mode("exact") generate()
    equals the forward over the batch and each sequence alone; stock is the control (its batch differs)."""
    out = tmp_path / "step.json"
    sizes = ["--batch", "2", "--prompt-min", "8", "--prompt-max", "24", "--new", "4", "--train-batch", "2",
             "--train-len", "40", "--check-batch", "3", "--check-new", "6", "--reps", "1"]  # fmt: skip
    res = run_bench("model_step", "--model", model, "--tiers", "stock,mode-exact", *sizes, "--json", str(out))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    record = json.loads(out.read_text())
    check = record["mode-exact"]["check"]
    assert check["logits_differ"] == check["logits_differ_alone"] == 0 < check["logits_compared"], check
    assert record["stock"]["check"]["logits_differ_alone"] > 0, "the control: stock's batch differs from alone"
    assert record["mode-exact"]["train_synced_s_over_stock"] > 0


def test_the_grouped_gemm_bench_checks_every_experts_rows_on_the_cpu(tmp_path: Path) -> None:
    """Every form (the experts' forward, dX and dW, in transformers' layouts) timed against torch._grouped_mm, and
    the tier's rows those of each expert's product alone, run to run, including an expert that got no row."""
    out = tmp_path / "grouped.json"
    res = run_bench("grouped_gemm", "--tier", "exact", "--tokens", "24,2", "--hidden", "32", "--expert", "16",
                    "--experts", "8", "--top", "2", "--reps", "1", "--json", str(out))  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["form"] for r in rows] == ["gate_up", "down", "down dX", "down dW"] * 2
    assert any(r["rows_per_expert"][0] == 0 for r in rows), "two tokens top-2 leave some of 8 experts empty"
    for r in rows:
        assert r["tier_differs_from_alone"] == r["tier_run_to_run_differs"] == 0 < r["elements"], r
        assert r["speed_synced"] > 0 and r["speed_queued"] > 0
    bad = run_bench("grouped_gemm", "--tier", "exact", "--tiles", "64x64x4x4")
    assert bad.returncode != 0 and "needs a GPU and --tier fast" in bad.stderr, "a sweep the CPU cannot run is refused"
    from bench.grouped_gemm import parse_tiles

    assert parse_tiles("64x128x4x4; 128x256x8x3") == [
        {"block_m": 64, "block_n": 128, "num_warps": 4, "num_stages": 4},
        {"block_m": 128, "block_n": 256, "num_warps": 8, "num_stages": 3},
    ]
    with pytest.raises(SystemExit, match="BLOCK_MxBLOCK_NxWARPSxSTAGES"):
        parse_tiles("64x128")
    import torch

    from bench.grouped_gemm import differing, operands, per_expert

    offs = torch.tensor([3, 7, 12, 12], dtype=torch.int32)  # the last expert got no row
    for form in ("down", "down dW"):  # the control: one element's last bit flipped is counted
        a, b = operands(form, 12, 8, 4, 4, torch.float32, "cpu", seed=0)
        alone = per_expert(a, b, offs, form)
        got = [w for w in alone if w is not None]
        out = torch.stack([*got, torch.zeros_like(got[0])]) if form == "down dW" else torch.cat(got)
        flipped = out.clone()
        flipped.view(-1).view(torch.int32)[5] ^= 1
        assert differing(out, alone, offs, form) == 0 and differing(flipped, alone, offs, form) == 1


@pytest.mark.slow  # a model step in a subprocess
def test_the_rl_step_can_time_the_training_step_alone(tmp_path: Path) -> None:
    """--skip check,rollout: the training steps alone (a mode's eager rollout takes minutes at 1.7B), ratios to
    stock's training step; --skip check,train: the rollout alone; an unknown stage is refused by name."""
    out = tmp_path / "step.json"
    sizes = ["--train-batch", "2", "--train-len", "12", "--reps", "1"]
    res = run_bench("model_step", "--model", "tiny", "--tiers", "stock,mode-exact", "--skip", "check,rollout", *sizes,
                    "--json", str(out))  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    record = json.loads(out.read_text())
    for tier in ("stock", "mode-exact"):
        assert "check" not in record[tier] and "rollout" not in record[tier] and record[tier]["train"]["synced_s"] > 0
    assert record["mode-exact"]["train_synced_s_over_stock"] > 0 and "rollout_synced_s_over_stock" not in record
    res = run_bench("model_step", "--model", "tiny", "--tiers", "stock,exact", "--skip", "check,train", *sizes,
                    "--json", str(out))  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    record = json.loads(out.read_text())
    assert not {"train", "train_fused_head"} & set(record["exact"]) and record["exact"]["rollout"]["synced_s"] > 0
    assert record["exact"]["rollout_synced_s_over_stock"] > 0
    bad = run_bench("model_step", "--model", "tiny", "--skip", "training")
    assert bad.returncode == 2 and "--skip takes check, rollout and train, not training" in bad.stderr


@pytest.mark.slow
def test_rollout_modes_runs_on_the_cpu_with_its_checks(tmp_path: Path) -> None:
    """rollout_modes at the tiny shape: the exact tier's generate() equals the training forward in every mode (the
    compiled one compiled on the CPU; continuous batching through its log-probs), stock's eager generate() and its
    continuous batching do not (the bits checked at a count not timed); each mode timed."""
    out = tmp_path / "modes.json"
    res = run_bench("rollout_modes", "--model", "tiny", "--tiers", "stock,exact", "--prompts", "3", "--new", "4",
                    "--check-at", "4", "--reps", "1", "--json", str(out))  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    record = json.loads(out.read_text())
    for mode in ("eager", "static", "compiled", "batched"):
        bits = record["exact"][f"{mode} bits"]
        assert bits["batch, left padded"] == bits["each sequence alone"] == 0 < bits["elements"], (mode, bits)
        assert record["exact"][f"{mode} 3"]["tokens_per_s"] > 0 and record["stock"][f"{mode} 3"]["tokens_per_s"] > 0
        assert f"{mode} 4" not in record["exact"] and bits["elements"] % 4 == 0, bits  # 4 prompts checked, not timed
        assert record["exact"][f"{mode} 3"]["warmup_new"] == 4  # --new 4: no warm-up past the timed length
    assert record["stock"]["eager bits"]["batch, left padded"] > 0  # the control: stock's rollout differs
    assert record["stock"]["batched bits"]["each sequence alone"] > 0  # and its continuous batching
    assert record["exact"]["batched bits"]["tokens not the forward's argmax"] == 0


@pytest.mark.slow
def test_rollout_process_runs_on_the_cpu_with_its_counts_and_checks(tmp_path: Path) -> None:
    """rollout_process at the tiny shape (stock and an exact-tier copy in one process, stock compiled first): every
    run counts its graphs and breaks (one graph per model for the first compiled shape, none for fullgraph on: the
    first's serve it; no break), the tier's bits equal the forward's in each mode checked, and a ratio per row."""
    out = tmp_path / "process.json"
    res = run_bench("rollout_process", "--model", "tiny", "--tier", "exact", "--modes", "compiled,eager,batched",
                    "--prompts", "3", "--new", "4", "--reps", "1", "--check-at", "2", "--check-new", "4", "--json",
                    str(out))  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    record = json.loads(out.read_text())
    runs = {(r["mode"], r["fullgraph"]): r for r in record["runs"]}
    assert set(runs) == {("compiled", False), ("compiled", True), ("eager", False), ("batched", False)}
    assert runs["compiled", False]["stock"]["graphs"] == runs["compiled", False]["exact"]["graphs"] == 1
    assert runs["compiled", True]["exact"]["graphs"] == 0 and record["dynamo"]["breaks"] == 0
    assert all(r["ratio"] > 0 for r in record["runs"])
    for mode in ("compiled", "eager", "batched"):
        bits = record[f"{mode} bits"]
        assert bits["batch, left padded"] == bits["each sequence alone"] == 0 < bits["elements"], (mode, bits)


def test_rollout_modes_warms_up_the_compiled_mode_at_the_timed_length_and_the_others_briefly() -> None:
    from bench.rollout_modes import warmup_tokens

    assert warmup_tokens("compiled", 256, None) == warmup_tokens("compiled", 256, 4) == 256  # its graphs' cache size
    assert warmup_tokens("eager", 256, None) == warmup_tokens("batched", 256, None) == 16
    assert warmup_tokens("static", 256, 4) == 4 and warmup_tokens("eager", 8, None) == 8  # never past --new


@pytest.mark.slow  # a model step in a subprocess
def test_profile_rollout_attributes_a_generate_on_the_cpu(tmp_path: Path) -> None:
    """profile_rollout at the tiny shape: every tier's generate() profiled, its time put in families (the exact
    tier's SwiGLU is its own kernel, stock's is not), busy time within the wall time's order."""
    out = tmp_path / "profile.json"
    res = run_bench("profile_rollout", "--model", "tiny", "--prompts", "2", "--new", "3", "--json", str(out))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]["2"]
    assert set(runs) == {"stock", "exact"}
    for tier, r in runs.items():
        assert r["wall_ms_per_token"] > 0 and r["busy_ms_per_token"] > 0, (tier, r)
        assert {"linear", "rms_norm", "attention glue"} & set(r["families_ms_per_token"]), r
    assert runs["exact"]["families_ms_per_token"]["swiglu"] > 0
    assert runs["stock"]["families_ms_per_token"]["linear"] > 0  # aten::mm, by the kernel-name rule


def test_device_times_counts_kernels_no_op_claims_and_leaves_sync_waits_out(monkeypatch) -> None:
    """profile_step.device_times on a GPU profile: a kernel an op launched counts once, with the op; a Triton kernel
    launched outside any torch op (no op lists it) still counts, by its name; the device's side of a host sync
    (Stream Sync) is a wait, and a hooked module's profiler range on the device's timeline a span, not a kernel."""
    from types import SimpleNamespace

    import torch

    monkeypatch.syspath_prepend(str(REPO))
    from bench import profile_step, timing

    monkeypatch.setattr(timing, "gpu", lambda: True)
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def device(name: str, us: float) -> SimpleNamespace:
        return SimpleNamespace(name=name, device_type=cuda, device_time_total=us, kernels=[], cpu_children=[],
                               cpu_parent=None)  # fmt: skip

    kernel = SimpleNamespace(name="cutlass_gemm_bf16", duration=10.0)
    mm = SimpleNamespace(name="aten::mm", device_type=cpu, device_time_total=10.0, kernels=[kernel], cpu_children=[],
                         cpu_parent=None)  # fmt: skip
    events = [mm, device("cutlass_gemm_bf16", 10.0), device("_gemm_kernel", 30.0), device("Stream Sync", 500.0),
              device(profile_step.LABEL + "Qwen3MLP", 700.0)]  # fmt: skip
    other: dict[str, float] = {}
    found = profile_step.device_times(SimpleNamespace(events=lambda: events), steps=2, other=other)
    assert found == {"linear": (10.0 + 30.0) / 1e3 / 2}, found
    assert other == {}, "a module range's shadow on the device timeline is not a kernel"


@pytest.mark.slow  # a model step in a subprocess
def test_profile_step_runs_every_contender_on_the_cpu(tmp_path: Path) -> None:
    """profile_step at the tiny shape with --mode: stock, the exact tier unfused and through its fused head, and the
    unpatched model under rl_kernel.mode("exact"), each profiled (device times per family) and timed."""
    out = tmp_path / "step.json"
    res = run_bench("profile_step", "--model", "tiny", "--train-batch", "2", "--train-len", "12", "--steps", "1",
                    "--reps", "1", "--mode", "--json", str(out))  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    record = json.loads(out.read_text())
    names = ("stock", "exact", "exact fused head", "mode-exact")
    assert tuple(record["families"]) == names and all(record["step_synced_s"][n] > 0 for n in names)
    families = record["families"]
    assert families["exact fused head"]["log-prob head"] > 0 and families["mode-exact"]["swiglu"] > 0
