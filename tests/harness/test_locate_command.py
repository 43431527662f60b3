"""`rlparity locate ARGS...`: the host command runs `python -m rl_kernel.locate ARGS...` and passes its verdict on as
the exit code: 0 when a patched tiny model's rollout and training paths agree, 1 when they differ (the stock model; a
user's model with a planted decode-variant layer, named exactly), 3 for bad arguments (rl_kernel.locate's own
options: a factory that does not import), 2 when it crashed (never 1), and a report in --json. Its output is the
subprocess's, passed through (capfd)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from rlparity import cli, gate

pytest.importorskip("transformers")

TINY = ["--layers", "2", "--hidden", "32", "--vocab", "97", "--batch", "3", "--prompt", "6", "--new", "3"]

USER = textwrap.dedent(
    """
    import torch
    from torch import nn
    from rl_kernel.models import tiny_model

    def planted():
        model = tiny_model("qwen3", 97, layers=3, hidden=32, heads=4, tier="exact")
        proj = model.model.layers[1].mlp.down_proj
        forward = proj.forward
        def nudged(x):
            out = forward(x)
            return torch.nextafter(out, torch.full_like(out, float("inf"))) if x.shape[1] == 1 else out
        proj.forward = nudged
        return model

    class Scale(nn.Module):
        def forward(self, x):  # batch-variant: one ulp up when the batch has more than one row
            return torch.nextafter(x, torch.full_like(x, float("inf"))) if x.shape[0] > 1 else x

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Identity(), Scale(), nn.Identity()])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    def paths():
        net, x = Net(), torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0))
        return (lambda: net(x[:1]), lambda: net(x), net, {"view_b": lambda t: t[:1]})

    def nothing_to_compare():
        net = Net()
        return (lambda: net(torch.ones(1, 2)), lambda: net(torch.ones(2, 3)), net)

    def broken():
        raise KeyError("factory bug")
    """
)


def locate(tmp_path: Path, *args: str) -> tuple[int, dict | None]:
    out = tmp_path / "report.json"
    code = cli.main(["locate", *args, "--json", str(out)])
    return code, json.loads(out.read_text()) if out.exists() else None


def test_exit_0_when_the_paths_agree_and_1_when_a_users_planted_layer_differs(tmp_path, monkeypatch, capfd):
    code, report = locate(tmp_path, *TINY, "--tier", "exact")
    assert code == gate.OK, capfd.readouterr().out
    assert report["equal"] is True and report["first"] is None and report["exit"] == 0
    assert len(report["modules"]) > 20 and [layer["share"] for layer in report["layers"]] == [0.0, 0.0]
    assert "bitwise equal" in capfd.readouterr().out
    # the same model (as a user's factory) with layer 1's down_proj one ulp up in decode steps only
    (tmp_path / "user_pkg_locate.py").write_text(USER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    code, report = locate(tmp_path, "--model", "user_pkg_locate:planted", "--batch", "2", "--prompt", "5")
    assert code == gate.MISMATCH, capfd.readouterr().out
    assert report["first"]["name"] == "model.layers.1.mlp.down_proj" and report["first"]["max_ulp"] == 1
    assert [layer["share"] for layer in report["layers"]][:1] == [0.0]


def test_the_stock_model_differs_exit_1_and_the_report_names_the_module(tmp_path, capfd):
    code, report = locate(tmp_path, *TINY, "--tier", "stock", "--batch", "4")
    out = capfd.readouterr().out
    assert code == gate.MISMATCH, out
    first = report["first"]["name"]
    assert first.startswith("model.") and f"first divergent module: {first}" in out
    assert report["equal"] is False and report["first"]["max_ulp"] > 0


def test_a_factory_of_two_callables_is_compared_with_locate_paths(tmp_path, monkeypatch, capfd):
    (tmp_path / "user_pkg_locate.py").write_text(USER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    code, report = locate(tmp_path, "--model", "user_pkg_locate:paths")
    assert code == gate.MISMATCH, capfd.readouterr().out
    assert report["first"]["name"] == "blocks.1" and report["labels"] == ["a", "b"]
    assert [m["name"] for m in report["modules"] if m["equal"]] == ["blocks.0"]


@pytest.mark.parametrize(
    "args, problem",
    [
        (["--family", "gpt2"], "invalid choice: 'gpt2'"),
        (["--batch", "0"], "must be >= 1, got 0"),
        (["--new", "x"], "invalid _positive value: 'x'"),
        (["--device", "tpu"], "tpu"),
        (["--model", "no-colon"], "--model takes pkg.module:factory, got 'no-colon'"),
    ],
)
def test_bad_arguments_exit_3_and_say_why(args, problem, capfd):
    """rl_kernel.locate checks its own options (the host keeps no copy of them)."""
    assert cli.main(["locate", *args]) == gate.CONFIG
    assert problem in capfd.readouterr().err


def test_help_is_rl_kernel_locates(capfd):
    assert cli.main(["locate", "--help"]) == gate.OK
    out = capfd.readouterr().out
    assert out.startswith("usage: python -m rl_kernel.locate") and "--family {llama,qwen2,qwen3,mistral," in out


def test_a_crash_is_exit_2_never_1(tmp_path, monkeypatch, capfd):
    """An exception rl_kernel.locate does not catch (here a KeyError from a user's factory) would be Python's exit 1,
    which says the paths differ: the host makes it 2 and the traceback is shown."""
    (tmp_path / "user_pkg_locate.py").write_text(USER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    code, report = locate(tmp_path, "--model", "user_pkg_locate:broken")
    assert code == gate.ERROR and report is None
    assert "KeyError: 'factory bug'" in capfd.readouterr().err


def test_a_factory_that_does_not_import_or_gives_nothing_to_compare_exits_3(tmp_path, monkeypatch, capfd):
    code, report = locate(tmp_path, "--model", "no_such_module_here:factory")
    assert code == gate.CONFIG and report is None
    assert "no_such_module_here" in capfd.readouterr().err
    (tmp_path / "user_pkg_locate.py").write_text(USER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    code, report = locate(tmp_path, "--model", "user_pkg_locate:nothing_to_compare")
    assert code == gate.CONFIG and report is None  # not 1: no verdict without a comparison
    assert "no module output could be compared" in capfd.readouterr().err
