"""The engines workload's suite (rlparity.cell.workloads.engines): the user's rollout engine and trainer, named by
import strings in the matrix; the trainer's log-probs of the rollout's tokens against the rollout's, bit for bit
(integer views), and run to run. Mismatch metrics where they differ. Bad configuration: Recorder.config_error."""

from __future__ import annotations

from typing import Any

import torch

from rlparity.cell import mismatch
from rlparity.cell.placement import devices
from rlparity.cell.workloads.engines import engine as E

_FIRST: dict[tuple, tuple[dict, dict]] = {}


def _sid(cell, shape) -> str:
    return f"engines:{cell.shapes}:{'x'.join(map(str, shape))}"


def _callables(record, params: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    found = {}
    for key in ("rollout", "train"):
        try:
            found[key] = E.resolve(params[key])
        except E.EngineConfigError as exc:
            record.config_error(key, str(exc))
    engine = params["engine"]
    if not isinstance(engine, dict):
        record.config_error("engine", f"must be a table of the engine's parameters, got {engine!r}")
    for key in ("rollout", "train"):
        record.info.setdefault("engine_packages", {})[key] = E.package_of(found[key], params[key])
    return found["rollout"], found["train"], dict(engine)


def _run(cell, record, shape, params) -> tuple[dict, dict]:
    rollout, train, engine = _callables(record, params)
    rollout_dev, train_dev = devices(cell.platform, cell.placement)
    common = dict(shape=tuple(shape), dtype=cell.dtype, seed=cell.seed, tier=cell.tier)
    r = rollout(device=rollout_dev, **common, **engine)
    problems = E.check(r, "rollout", tuple(shape))
    if problems:
        record.config_error("rollout", f"{params['rollout']} returned {'; '.join(problems)}")
    tokens = r["tokens"].detach().cpu()
    t = train(tokens.clone().to(train_dev), device=train_dev, **common, **engine)
    problems = E.check(t, "train", tuple(shape))
    if problems:
        record.config_error("train", f"{params['train']} returned {'; '.join(problems)}")
    return r, t


def _first(cell, record, shape, params) -> tuple[dict, dict]:
    key = (cell.id, tuple(shape))
    if key not in _FIRST:
        _FIRST[key] = _run(cell, record, shape, params)
    return _FIRST[key]


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu()


def test_rollout_logprobs_equal_the_trainers(cell, record, shape, params):
    """The trainer's log-probs of the rollout's tokens == the rollout's, bit for bit; and, where both engines give
    them, their logits digests and every common layer's digest. Mismatch metrics when the log-probs differ."""
    r, t = _first(cell, record, shape, params)
    sid = _sid(cell, shape)
    record.output(f"{sid}/tokens", _cpu(r["tokens"]))
    record.output(f"{sid}/rollout logprobs", _cpu(r["logprobs"]))
    record.output(f"{sid}/train logprobs", _cpu(t["logprobs"]))
    for role, out in (("rollout", r), ("train", t)):
        if "logits_digest" in out:
            record.digests[f"{sid}/{role} logits"] = out["logits_digest"]
        for name, dig in out.get("layer_digests", {}).items():
            record.digests[f"{sid}/{role} layer {name}"] = dig
    failures = []
    d = record.compare(f"{sid} rollout vs train logprobs", _cpu(r["logprobs"]), _cpu(t["logprobs"]))
    if not d.equal:
        failures.append(f"log-probs: {d.summary()}")
        for name, value in mismatch.metrics(_cpu(r["logprobs"]), _cpu(t["logprobs"])).items():
            record.metric(f"{sid} {name}", value)
    both = "logits_digest" in r and "logits_digest" in t
    if both and not record.compare_digest(f"{sid} rollout vs train logits", t["logits_digest"], r["logits_digest"]):
        failures.append("logits digests differ")
    layers_r, layers_t = r.get("layer_digests", {}), t.get("layer_digests", {})
    for name in [n for n in layers_r if n in layers_t]:
        if not record.compare_digest(f"{sid} rollout vs train layer {name}", layers_t[name], layers_r[name]):
            failures.append(f"first differing layer: {name}")
            break
    assert not failures, "; ".join(failures)


def test_runs_repeat_bit_for_bit(cell, record, shape, params):
    """Both engines again (cell.repeats - 1 more runs, each from the seed): the same tokens and log-probs."""
    first_r, first_t = _first(cell, record, shape, params)
    sid = _sid(cell, shape)
    failures = []
    for i in range(1, cell.repeats):
        r, t = _run(cell, record, shape, params)
        for name, a, b in (
            ("tokens", r["tokens"], first_r["tokens"]),
            ("rollout logprobs", r["logprobs"], first_r["logprobs"]),
            ("train logprobs", t["logprobs"], first_t["logprobs"]),
        ):
            d = record.compare(f"{sid} repeat {i} {name}", _cpu(a), _cpu(b))
            if not d.equal:
                failures.append(f"repeat {i} {name}: {d.summary()}")
    assert cell.repeats >= 2, "a cell runs its engines at least twice"
    assert not failures, "; ".join(failures)
