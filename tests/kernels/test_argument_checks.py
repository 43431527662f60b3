"""Every public operator checks every tensor argument's device and dtype before a kernel runs.

A meta tensor among CPU ones used to dispatch to the operator's fake implementation, which returned
uninitialised host memory (rl_kernel.linear with a meta weight gave "logits" where F.linear raises). Each
operator below gets each of its tensor arguments on `meta` and with a wrong dtype, and must raise the
"rl_kernel:" ValueError (device) or TypeError (dtype) naming that argument. Arguments an operator copies
to the device itself (rope_table's inv_freq, gumbel_argmax's keys and step) may be on the CPU; on any
other device they are errors too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch

import rl_kernel
import rl_kernel.head.parallel as P
import rl_kernel.head.rowtree as T
from rl_kernel.optim import ExactAdamW

V = 16  # vocabulary of the softmax-family cases: two 8-column slices for rl_kernel.head.parallel


@dataclass(frozen=True)
class Op:
    """One operator call: call(**tensors) with CPU tensors made by make(); wrong[name] is a wrong dtype for that
    argument; host_ok names the arguments that may stay on the CPU (the operator copies them)."""

    name: str
    make: Callable[[], dict[str, torch.Tensor]]
    call: Callable[..., object]
    wrong: dict[str, torch.dtype]
    host_ok: tuple[str, ...] = ()
    lists: dict[str, int] = field(default_factory=dict)  # list arguments: name -> length ("parts" -> parts[k])


def _r(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _softmax_args() -> dict[str, torch.Tensor]:
    return {"logits": _r(3, V), "tokens": torch.tensor([1, 9, 15])}


def _slices() -> list[T.Slice]:
    return [T.Slice(0, 8, V), T.Slice(8, 8, V)]


def _parts_stats() -> dict[str, torch.Tensor]:
    x, s = _r(3, V), _slices()
    return {"parts[0]": T.local_stats(x[:, :8], s[0]), "parts[1]": T.local_stats(x[:, 8:], s[1])}


def _entropy_parts() -> dict[str, torch.Tensor]:
    x, s = _r(3, V), _slices()
    stats = T.join_stats([T.local_stats(x[:, :8], s[0]), T.local_stats(x[:, 8:], s[1])], s)
    parts = {f"parts[{k}]": T.local_entropy(x[:, 8 * k : 8 * k + 8], stats, s[k]) for k in range(2)}
    return {**parts, "stats": stats}


def _lp_parts() -> dict[str, torch.Tensor]:
    x, s, tok = _r(3, V), _slices(), torch.tensor([1, 9, 15])
    stats = T.join_stats([T.local_stats(x[:, :8], s[0]), T.local_stats(x[:, 8:], s[1])], s)
    parts = {f"parts[{k}]": T.local_token_logprobs(x[:, 8 * k : 8 * k + 8], tok, stats, s[k]) for k in range(2)}
    return {**parts, "tokens": tok}


def _parts(t: dict[str, torch.Tensor], prefix: str = "parts") -> list[torch.Tensor]:
    return [t[k] for k in sorted(t) if k.startswith(prefix + "[")]


def _rope() -> dict[str, torch.Tensor]:
    return {"positions": torch.arange(6).view(2, 3), "inv_freq": rl_kernel.rope_inv_freq(8)}


def _rotary() -> dict[str, torch.Tensor]:
    cos, sin = rl_kernel.rope_table(torch.arange(3).repeat(2, 1), rl_kernel.rope_inv_freq(8))
    return {"x": _r(2, 2, 3, 8), "cos": cos, "sin": sin}


def _attention() -> dict[str, torch.Tensor]:
    return {
        "q": _r(2, 2, 4, 8),
        "k": _r(2, 1, 4, 8, seed=1),
        "v": _r(2, 1, 4, 8, seed=2),
        "q_pos": torch.arange(4).repeat(2, 1),
        "k_start": torch.tensor([0, 1]),
    }


def _local() -> dict[str, torch.Tensor]:
    x = _r(3, V)
    s = _slices()
    stats = T.join_stats([T.local_stats(x[:, :8], s[0]), T.local_stats(x[:, 8:], s[1])], s)
    return {"local": x[:, :8].contiguous(), "tokens": torch.tensor([1, 9, 15]), "stats": stats}


F64, I32 = torch.float64, torch.int32
OPS = [
    Op("linear", lambda: {"x": _r(3, 8), "weight": _r(4, 8, seed=1), "bias": _r(4, seed=2)}, rl_kernel.linear,
       {"x": F64, "weight": F64, "bias": F64}),
    Op("linear(bf16)", lambda: {"x": _r(3, 8, dtype=torch.bfloat16), "weight": _r(4, 8, dtype=torch.bfloat16)},
       rl_kernel.linear, {"weight": torch.float32}),
    Op("rms_norm", lambda: {"x": _r(3, 8), "weight": _r(8, seed=1)}, rl_kernel.rms_norm, {"x": F64, "weight": F64}),
    Op("rope_table", _rope, rl_kernel.rope_table, {"positions": I32, "inv_freq": F64}, host_ok=("inv_freq",)),
    Op("rotary", _rotary, rl_kernel.rotary, {"x": F64, "cos": torch.bfloat16, "sin": F64}),
    Op("silu_mul", lambda: {"gate": _r(3, 8), "up": _r(3, 8, seed=1)}, rl_kernel.silu_mul,
       {"gate": F64, "up": torch.bfloat16}),
    Op("attention", _attention, rl_kernel.attention,
       {"q": F64, "k": torch.bfloat16, "v": F64, "q_pos": I32, "k_start": I32}),
    Op("embedding", lambda: {"ids": torch.tensor([[1, 2], [3, 0]]), "weight": _r(5, 8)}, rl_kernel.embedding,
       {"ids": I32, "weight": F64}),
    Op("token_logprobs", _softmax_args, rl_kernel.token_logprobs, {"logits": F64, "tokens": torch.float32}),
    Op("log_softmax", lambda: {"logits": _r(3, V)}, rl_kernel.log_softmax, {"logits": F64}),
    Op("BitwiseLogSoftmax", lambda: {"logits": _r(3, V)}, rl_kernel.BitwiseLogSoftmax.apply, {"logits": F64}),
    Op("log_softmax_backward", lambda: {"grad_output": _r(3, V), "output": _r(3, V, seed=1)},
       rl_kernel.log_softmax_backward, {"grad_output": F64, "output": F64}),
    Op("entropy", lambda: {"logits": _r(3, V)}, rl_kernel.entropy, {"logits": F64}),
    Op("row_stats", lambda: {"logits": _r(3, V)}, rl_kernel.row_stats, {"logits": F64}),
    Op("gumbel_argmax",
       lambda: {"scores": _r(3, V), "keys": torch.tensor([5, 6, 7]), "step": torch.tensor([1, 2, 3])},
       lambda scores, keys, step: rl_kernel.gumbel_argmax(scores, 11, step, keys),
       {"scores": F64, "keys": I32, "step": I32}, host_ok=("keys", "step")),
    Op("lm_head_logprobs",
       lambda: {"hidden": _r(3, 8), "weight": _r(V, 8, seed=1), "tokens": torch.tensor([1, 9, 15]),
                "bias": _r(V, seed=2)},
       lambda hidden, weight, tokens, bias: rl_kernel.lm_head_logprobs(hidden, weight, tokens, bias=bias),
       {"hidden": F64, "weight": F64, "tokens": torch.float32, "bias": F64}),
    Op("lm_head_loss",
       lambda: {"hidden": _r(3, 8), "weight": _r(V, 8, seed=1), "tokens": torch.tensor([1, 9, 15]),
                "bias": _r(V, seed=2)},
       lambda hidden, weight, tokens, bias: rl_kernel.lm_head_loss(hidden, weight, tokens, lambda lp: -lp, torch.sum,
                                                                   bias=bias),
       {"hidden": F64, "weight": F64, "tokens": torch.float32, "bias": F64}),
    Op("parallel.lm_head_logprobs",
       lambda: {"hidden": _r(3, 8), "weight": _r(V, 8, seed=1), "tokens": torch.tensor([1, 9, 15])},
       lambda hidden, weight, tokens: P.lm_head_logprobs(hidden, weight, tokens, vocab_start=0, vocab_size=V),
       {"hidden": F64, "weight": F64, "tokens": torch.float32}),
    Op("parallel.token_logprobs", lambda: {"local_logits": _r(3, V), "tokens": torch.tensor([1, 9, 15])},
       lambda local_logits, tokens: P.token_logprobs(local_logits, tokens, vocab_start=0, vocab_size=V),
       {"local_logits": F64, "tokens": torch.float32}),
    Op("parallel.entropy", lambda: {"local_logits": _r(3, V)},
       lambda local_logits: P.entropy(local_logits, vocab_start=0, vocab_size=V), {"local_logits": F64}),
    Op("parallel.local_stats", lambda: {"local": _r(3, 8)}, lambda local: T.local_stats(local, _slices()[0]),
       {"local": F64}),
    Op("parallel.local_entropy", lambda: {k: v for k, v in _local().items() if k != "tokens"},
       lambda local, stats: T.local_entropy(local, stats, _slices()[0]), {"local": F64, "stats": F64}),
    Op("parallel.local_token_logprobs", _local,
       lambda local, tokens, stats: T.local_token_logprobs(local, tokens, stats, _slices()[0]),
       {"local": F64, "stats": F64}),
    Op("parallel.join_stats", _parts_stats, lambda **t: T.join_stats(_parts(t), _slices()),
       {"parts[0]": F64, "parts[1]": F64}),
    Op("parallel.join_entropy", _entropy_parts, lambda **t: T.join_entropy(_parts(t), t["stats"], _slices()),
       {"parts[1]": F64, "stats": F64}),
    Op("parallel.join_token_logprobs", _lp_parts,
       lambda **t: T.join_token_logprobs(_parts(t), t["tokens"], _slices()), {"parts[0]": F64, "parts[1]": F64}),
    Op("parallel.simulate_token_logprobs", _softmax_args,
       lambda logits, tokens: P.simulate_token_logprobs(logits, tokens, [8, 8]),
       {"logits": F64, "tokens": torch.float32}),
    Op("parallel.simulate_rank_order_token_logprobs", _softmax_args,
       lambda logits, tokens: P.simulate_rank_order_token_logprobs(logits, tokens, [8, 8]),
       {"logits": F64, "tokens": torch.float32}),
    Op("parallel.simulate_stats", lambda: {"logits": _r(3, V)}, lambda logits: P.simulate_stats(logits, [8, 8]),
       {"logits": F64}),
    Op("parallel.simulate_entropy", lambda: {"logits": _r(3, V)}, lambda logits: P.simulate_entropy(logits, [8, 8]),
       {"logits": F64}),
    Op("parallel.sum_allreduce_token_logprobs", lambda: {"local_logits": _r(3, V), "tokens": torch.tensor([1, 9, 15])},
       lambda local_logits, tokens: P.sum_allreduce_token_logprobs(local_logits, tokens, vocab_start=0, vocab_size=V),
       {"local_logits": F64, "tokens": torch.float32}),
    Op("parallel.rank_order_token_logprobs",
       lambda: {"local_logits": _r(3, V), "tokens": torch.tensor([1, 9, 15])},
       lambda local_logits, tokens: P.rank_order_token_logprobs(local_logits, tokens, vocab_start=0, vocab_size=V),
       {"local_logits": F64, "tokens": torch.float32}),
    Op("parallel.rank_order_stats",
       lambda: {f"parts_whole[{k}]": T.local_stats(_r(3, 8, seed=k), T.Slice(0, 8, 8)) for k in range(2)},
       lambda **t: P.rank_order_stats(_parts(t, "parts_whole")), {"parts_whole[1]": F64}),
]  # fmt: skip


def _named(arg: str) -> str:
    """A regex that matches the argument's name as a word (parts[1], state['m'])."""
    return r"(?<![\w\[])" + re.escape(arg) + r"(?![\w\]])"


DEVICE_CASES = [(op, arg) for op in OPS for arg in op.make() if len(op.make()) > 1]
DTYPE_CASES = [(op, arg) for op in OPS for arg in op.wrong]


@pytest.mark.parametrize(("op", "arg"), DEVICE_CASES, ids=[f"{o.name}-{a}" for o, a in DEVICE_CASES])
def test_an_argument_on_another_device_is_named(op: Op, arg: str) -> None:
    """One argument on meta, the others on the CPU: a ValueError that names it (never an output: the fake
    implementation's would be uninitialised host memory). Where every other argument may stay on the host
    (rope_table's positions, gumbel_argmax's scores), the call is all-meta in effect: its output is meta."""
    tensors = op.make()
    tensors[arg] = tensors[arg].to("meta")
    if all(other in op.host_ok for other in tensors if other != arg):
        out = op.call(**tensors)
        outs = out if isinstance(out, tuple) else (out,)
        assert all(o.device.type == "meta" for o in outs), [o.device for o in outs]
        return
    with pytest.raises(ValueError, match=r"^rl_kernel(\.parallel)?: .*" + _named(arg)) as info:
        op.call(**tensors)
    assert "meta" in str(info.value), info.value


@pytest.mark.parametrize(("op", "arg"), DTYPE_CASES, ids=[f"{o.name}-{a}" for o, a in DTYPE_CASES])
def test_an_argument_of_a_wrong_dtype_is_named(op: Op, arg: str) -> None:
    tensors = op.make()
    tensors[arg] = tensors[arg].to(op.wrong[arg])
    with pytest.raises(TypeError, match=r"^rl_kernel: .*" + _named(arg)):
        op.call(**tensors)


def test_a_host_copied_argument_on_the_cpu_is_accepted() -> None:
    """The exception to the rule, kept from before: rope_inv_freq's CPU table works with positions anywhere
    (here on the CPU too; the meta case above shows positions' device is the output's)."""
    cos, sin = rl_kernel.rope_table(torch.arange(4).view(1, 4), rl_kernel.rope_inv_freq(8))
    assert cos.device.type == "cpu" and cos.shape == (1, 4, 4) and sin.shape == (1, 4, 4)


def test_every_public_operator_is_covered() -> None:
    """A new public operator of rl_kernel gets a row here (the list is the checks' only source)."""
    public = {
        n
        for n in rl_kernel.__all__
        if callable(getattr(rl_kernel, n))
        and n not in ("has_gpu_kernels", "positions_from_mask", "rope_inv_freq", "mode")  # mode: test_mode.py
    }
    assert public <= {op.name for op in OPS}, public - {op.name for op in OPS}


# ---- ExactAdamW: the parameter, its gradient and its state on one device -------------------------------
def _stepped(param_dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Parameter, ExactAdamW]:
    p = torch.nn.Parameter(_r(4, dtype=param_dtype))
    opt = ExactAdamW([p], lr=0.1)
    p.grad = torch.ones_like(p)
    opt.step()  # creates the state
    return p, opt


@pytest.mark.parametrize("name", ["m", "v"])
def test_adamw_state_on_another_device_is_named(name: str) -> None:
    p, opt = _stepped()
    before = p.detach().clone()
    opt.state[p][name] = opt.state[p][name].to("meta")
    with pytest.raises(ValueError, match=r"^rl_kernel: .*" + _named(f"state[{name!r}]") + ".*meta"):
        opt.step()
    assert torch.equal(p.detach().view(torch.int32), before.view(torch.int32)), "the parameter moved"


@pytest.mark.parametrize("name", ["m", "v"])
def test_adamw_state_of_a_wrong_dtype_is_named(name: str) -> None:
    p, opt = _stepped()
    opt.state[p][name] = opt.state[p][name].double()
    with pytest.raises(TypeError, match=r"^rl_kernel: .*" + _named(f"state[{name!r}]")):
        opt.step()


def test_adamw_grad_of_another_dtype_is_named() -> None:
    """torch refuses such a grad unless grad_dtype is cleared; then ExactAdamW must refuse it itself."""
    p, opt = _stepped(torch.bfloat16)
    p.grad_dtype = None
    p.grad = torch.ones(4, dtype=torch.float32)
    with pytest.raises(TypeError, match=r"^rl_kernel: .*" + _named("grad")):
        opt.step()
