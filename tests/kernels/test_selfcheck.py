"""`make selfcheck` (rl_kernel.contract.selfcheck): passes on this build, and a planted mismatch fails it.

Its counts are split by kind (CPU vs GPU, run to run, batch/order), and on a machine without a GPU it says
that nothing was compared across devices: a CPU-only pass must not read as device parity.
"""

from __future__ import annotations

import json

import pytest
import torch

from rl_kernel.contract import selfcheck
from rl_kernel.exact.softmax import checks as softmax


def test_selfcheck_passes_and_prints_a_table(capsys) -> None:
    assert selfcheck.main(["--vocabs", "7,257"]) == 0
    out = capsys.readouterr().out
    assert "bitwise self-check" in out and "comparisons" in out and "equal" in out


@pytest.fixture
def no_gpu(monkeypatch):
    """This machine as one without a GPU, whatever it has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_cpu_only_output_says_no_device_was_compared(no_gpu, tmp_path, capsys) -> None:
    out_json = tmp_path / "selfcheck.json"
    assert selfcheck.main(["--vocabs", "7,257", "--json", str(out_json)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich may wrap long lines
    rec = json.loads(out_json.read_text())
    total = sum(c["checks"] for c in rec["cases"])
    assert rec["gpu"] is False and rec["comparisons"]["cpu_vs_gpu"] == 0
    assert rec["comparisons"]["run_to_run"] + rec["comparisons"]["batch"] == total > 0
    assert rec["equal"] == rec["comparisons"]
    assert f"CPU only: {total}/{total} run-to-run/batch comparisons equal" in out
    assert "0 CPU-vs-GPU comparisons: no GPU here" in out
    assert "nothing is compared across devices" in out
    assert "cpu + cpu" not in out  # the old header, which read like a two-device run
    assert "comparisons bitwise equal" not in out  # the old closing line, which read like a parity pass


def test_counts_are_split_by_kind(no_gpu, tmp_path) -> None:
    out_json = tmp_path / "selfcheck.json"
    assert selfcheck.main(["--vocabs", "257", "--json", str(out_json)]) == 0
    for case in json.loads(out_json.read_text())["cases"]:
        kinds = case["by_kind"]
        assert set(kinds) == set(selfcheck.KINDS) and sum(kinds.values()) == case["checks"]
        # batch/order: softmax's two (a row alone, the reversed batch) and the decoder's four (linear's row
        # alone, attention's decode rows, its windowed decode rows over a cut cache, the tiny decoder's rollout),
        # size 257 being one of the decoder's.
        assert kinds["cpu_vs_gpu"] == 0 and kinds["run_to_run"] > 0 and kinds["batch"] == 2 + 4


def test_kind_of_each_check_name() -> None:
    assert selfcheck.kind_of("token_logprobs.grad cpu == gpu") == "cpu_vs_gpu"
    assert selfcheck.kind_of("entropy gpu run-to-run") == "run_to_run"
    assert selfcheck.kind_of("entropy cpu run-to-run") == "run_to_run"
    assert selfcheck.kind_of("token_logprobs cuda reversed batch") == "batch"
    assert selfcheck.kind_of("token_logprobs cuda row alone == in batch") == "batch"


def test_summary_with_a_gpu_names_every_kind() -> None:
    totals = {"cpu_vs_gpu": 189, "run_to_run": 378, "batch": 54}
    equal = {"cpu_vs_gpu": 188, "run_to_run": 378, "batch": 54}
    (line,) = selfcheck.summary_lines(True, totals, equal)
    assert line == "620/621 comparisons bitwise equal: CPU vs GPU 188/189, run to run 378/378, batch/order 54/54"
    (cpu_line,) = selfcheck.summary_lines(False, {**totals, "cpu_vs_gpu": 0}, {**equal, "cpu_vs_gpu": 0})
    assert cpu_line.startswith("CPU only: 432/432 run-to-run/batch comparisons equal")
    assert "0 CPU-vs-GPU comparisons: no GPU here" in cpu_line


def test_selfcheck_catches_a_one_ulp_flip(monkeypatch, capsys, tmp_path) -> None:
    real = softmax.token_logprobs
    calls = {"n": 0}

    def flipped(*args, **kwargs):
        out = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:  # the second full pass (run-to-run) differs in one element by one ulp
            bits = out.detach().view(torch.int32).clone()
            bits[1] ^= 1
            return out + (bits.view(torch.float32) - out.detach())  # exact: keeps autograd
        return out

    monkeypatch.setattr(softmax, "token_logprobs", flipped)  # the spec's forward looks it up here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the count below is the CPU-only one
    assert selfcheck.main(["--vocabs", "257", "--json", str(tmp_path / "s.json")]) == 1
    assert "MISMATCH" in capsys.readouterr().out
    rec = json.loads((tmp_path / "s.json").read_text())
    assert rec["equal"]["run_to_run"] == rec["comparisons"]["run_to_run"] - 1  # counted under its kind


def test_require_gpu_without_gpu_is_an_error() -> None:
    if torch.cuda.is_available():
        return
    assert selfcheck.main(["--vocabs", "7", "--require-gpu"]) == 2


def test_a_tier_without_a_cpu_reference_checks_nothing_on_a_cpu_and_says_so(capsys, monkeypatch) -> None:
    """The fast tier has no CPU kernels: selfcheck compares nothing here and says why (exit 0); with
    --require-gpu it is exit 2. Its checks package is the tier's own (linear, attention with float64 references)."""
    from rl_kernel import tiers
    from rl_kernel.contract import families

    fast = tiers.get("fast")
    assert not fast.cpu_reference and {s.name for s in families.all_specs(fast)} >= {"linear", "attention"}
    assert all(s.reference is not None for s in families.all_specs(fast) if s.name in ("linear", "attention"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU-only path, on any machine
    assert selfcheck.main(["--tier", "fast"]) == 0
    assert "the fast tier has no CPU kernels and this machine has no GPU: nothing checked" in capsys.readouterr().out
    assert selfcheck.main(["--tier", "fast", "--require-gpu"]) == 2


def test_accuracy_checks_hold_an_output_to_its_bound() -> None:
    ref = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    assert selfcheck.Accuracy(selfcheck.relative_error(ref.float(), ref), 1e-6).equal
    assert not selfcheck.Accuracy(selfcheck.relative_error(ref.float() * 1.1, ref), 1e-2).equal
    assert not selfcheck.Accuracy(selfcheck.relative_error(torch.full((3,), float("nan")), ref), 1.0).equal
