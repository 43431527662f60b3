"""rl_kernel.triton_tier.launch: a Triton kernel launched through the CompiledKernel Triton's own launch chose, kept
under a key finer than Triton's specialization. On a machine without a GPU, with a stand-in kernel that records
which path each launch took: a repeat of one launch skips Triton's launch and passes every parameter in order (a
tensor as its pointer), and so does another int of the same class (what Triton specializes an int on); any change
Triton specializes on (dtype, 16-byte alignment, an int's 1 / % 16 / i32 range, a bool or float where an int was, a
constexpr, by keyword or by position, an option) goes back through Triton; hooks, the interpreter and tensor
descriptors always do."""

from __future__ import annotations

import pytest
import torch

from rl_kernel import triton_tier

from tooling import require

try:
    import triton  # noqa: F401

    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False


class Compiled:
    """A CompiledKernel's launch surface: run(grid0, grid1, grid2, stream, function, metadata, launch_metadata,
    enter_hook, exit_hook, *every parameter)."""

    function, packed_metadata = "cu-function", "packed"

    def __init__(self) -> None:
        self.runs: list[tuple] = []

    def run(self, *args) -> None:
        self.runs.append(args)


class Kernel:
    """A @triton.jit kernel's launch surface: arg_names, pre_run_hooks, kernel[grid](...) returning what it ran."""

    arg_names = ("x", "n", "scale", "BLOCK")
    constexprs = (3,)

    def __init__(self) -> None:
        self.pre_run_hooks: list = []
        self.triton_launches: list[tuple] = []
        self.compiled = Compiled()

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.triton_launches.append((grid, args, kwargs))
            return self.compiled

        return run


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> Kernel:
    require("triton", HAVE_TRITON)
    monkeypatch.setattr(triton_tier, "_LAUNCHED", {})
    monkeypatch.setattr(triton_tier, "interpreting", lambda: False)
    monkeypatch.setattr(triton_tier, "_stream_of", lambda: lambda device: 777)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return Kernel()


def _launch(kernel: Kernel, x: torch.Tensor, n: int = 64, block: int = 32, num_warps: int = 4) -> None:
    triton_tier.launch(kernel, (5,), x, n, 0.5, BLOCK=block, num_warps=num_warps)


def test_a_repeat_runs_the_kept_kernel_with_every_parameter_in_order(kernel: Kernel) -> None:
    x = torch.zeros(64)
    _launch(kernel, x)
    assert len(kernel.triton_launches) == 1 and kernel.compiled.runs == []
    _launch(kernel, x)
    assert len(kernel.triton_launches) == 1
    _launch(kernel, x, n=128)  # another multiple of 16 in int32: Triton's specialization of 64, the kept kernel
    _launch(kernel, x, n=17)  # not a multiple of 16: once through Triton, then kept for 33 too
    _launch(kernel, x, n=33)
    assert len(kernel.triton_launches) == 2
    first, second, third = kernel.compiled.runs
    # Every parameter in order, constexprs included (as Triton passes them), the tensor as its device pointer.
    assert first == (5, 1, 1, 777, "cu-function", "packed", None, None, None, x.data_ptr(), 64, 0.5, 32)
    assert second[-3] == 128 and second[-4] == x.data_ptr()
    assert third[-3] == 33


def test_a_replay_runs_the_kept_kernel_with_new_tensors_and_the_same_rest(kernel: Kernel) -> None:
    """launch_replay: the launch, then a Replay that runs the kept kernel with other tensors' pointers and the first
    call's other arguments (a plan's call), on the stream current at the replay."""
    x, y = torch.zeros(64), torch.ones(64)
    replay = triton_tier.launch_replay(kernel, (5, 2), x, 17, 0.5, BLOCK=32, num_warps=4)
    assert replay is not None and len(kernel.triton_launches) == 1 and kernel.compiled.runs == []
    assert replay(y) is True
    expected = (5, 2, 1, 777, "cu-function", "packed", None, None, None, y.data_ptr(), 17, 0.5, 32)
    assert kernel.compiled.runs == [expected]
    assert replay(y[1:]) is False and len(kernel.compiled.runs) == 1  # not 16-byte aligned: nothing launched
    again = triton_tier.launch_replay(kernel, (5, 2), x, 17, 0.5, BLOCK=32, num_warps=4)  # kept: no Triton launch
    assert again is not None and len(kernel.triton_launches) == 1 and len(kernel.compiled.runs) == 2


def test_a_replay_taking_ints_passes_them_anew_within_their_class(kernel: Kernel) -> None:
    """Replay.taking: the ints at the named positions come with each call (a decode step's key count); one of
    another class (what Triton specialized the kept kernel on) launches nothing; a position that is no int is
    refused."""
    x, y = torch.zeros(64), torch.ones(64)
    replay = triton_tier.launch_replay(kernel, (5,), x, 17, 0.5, BLOCK=32, num_warps=4).taking((0,))
    assert replay(y, ints=(33,)) is True
    assert kernel.compiled.runs[-1][-4:] == (y.data_ptr(), 33, 0.5, 32)
    for other in (32, 1, 2**31, ()):  # % 16, == 1, i64, none given
        assert replay(y, ints=other if isinstance(other, tuple) else (other,)) is False
    assert len(kernel.compiled.runs) == 1
    with pytest.raises(TypeError, match=r"Replay: the arguments at \(1,\) are not all ints"):
        replay.taking((1,))


def test_no_replay_where_tensors_do_not_lead_are_misaligned_or_hooked(kernel: Kernel) -> None:
    x = torch.zeros(64)
    trailing = triton_tier.launch_replay(kernel, (5,), x, 17, x, BLOCK=32, num_warps=4)  # a tensor after an int
    misaligned = triton_tier.launch_replay(kernel, (5,), x[1:], 17, 0.5, BLOCK=32, num_warps=4)
    kernel.pre_run_hooks.append(lambda *a, **k: None)
    hooked = triton_tier.launch_replay(kernel, (5,), x, 17, 0.5, BLOCK=32, num_warps=4)
    assert (trailing, misaligned, hooked) == (None, None, None)
    assert len(kernel.triton_launches) + len(kernel.compiled.runs) == 3  # each still launched


# Ints Triton types and specializes differently (native_specialize_impl): each class boundary on both sides, and
# multiples of 8 that are not of 16 (a class keyed on % 8 would merge them with the multiples of 16).
INTS = (0, 1, 2, 8, 15, 16, 17, 24, 32, 33, -1, -8, -16, -17, 2**31 - 16, 2**31 - 8, 2**31 - 1, 2**31, 2**31 + 1,
        -(2**31), -(2**31) - 1, -(2**31) - 16, 2**63 - 16, 2**63 - 1, 2**63, 2**63 + 16, -(2**63), 2**64 - 16,
        2**64 - 1)  # fmt: skip


def test_int_class_is_at_least_as_fine_as_tritons_specialization() -> None:
    """Two ints of one int_class must get one specialization from Triton itself, or a kept kernel would run
    another int with the wrong one compiled in."""
    require("triton", HAVE_TRITON)
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    def triton_class(v: int) -> tuple:
        return native_specialize_impl(BaseBackend, v, False, True, True)

    by_class: dict[tuple, set] = {}
    for v in INTS:
        by_class.setdefault(triton_tier.int_class(v), set()).add(triton_class(v))
    assert all(len(found) == 1 for found in by_class.values()), by_class
    assert len(by_class) >= 6  # not vacuous: the boundaries above fall in different classes


def test_a_positional_constexpr_is_keyed_by_value(kernel: Kernel) -> None:
    x = torch.zeros(64)
    triton_tier.launch(kernel, (5,), x, 64, 0.5, 32, num_warps=4)
    triton_tier.launch(kernel, (5,), x, 64, 0.5, 64, num_warps=4)  # BLOCK 64: another binary
    assert len(kernel.triton_launches) == 2 and kernel.compiled.runs == []


def test_a_kernel_that_names_no_constexprs_keys_every_int_by_value(kernel: Kernel) -> None:
    kernel.constexprs = None
    x = torch.zeros(64)
    _launch(kernel, x, n=64)
    _launch(kernel, x, n=128)
    assert len(kernel.triton_launches) == 2 and kernel.compiled.runs == []


X = torch.zeros(64)
# (a launch, the same kernel with one thing changed that Triton's specialization sees)
CHANGES = {
    "dtype": (dict(x=X), dict(x=X.double())),
    "misaligned pointer": (dict(x=X), dict(x=X[1:])),
    "int == 1": (dict(n=17), dict(n=1)),
    "bool for an int": (dict(n=1), dict(n=True)),
    "float for an int": (dict(n=1), dict(n=1.0)),
    "int a multiple of 16": (dict(n=17), dict(n=32)),
    "int past int32": (dict(n=17), dict(n=2**31 + 17)),
    "int past int64": (dict(n=2**31 + 17), dict(n=2**63 + 17)),
    "constexpr": (dict(block=32), dict(block=64)),
    "option": (dict(num_warps=4), dict(num_warps=8)),
}


@pytest.mark.parametrize("change", CHANGES)
def test_what_triton_specializes_on_goes_back_through_triton(kernel: Kernel, change: str) -> None:
    first, second = CHANGES[change]
    _launch(kernel, **{"x": X, **first})
    _launch(kernel, **{"x": X, **second})
    assert len(kernel.triton_launches) == 2 and kernel.compiled.runs == [], change


def test_hooks_the_interpreter_and_descriptors_take_tritons_launch(
    kernel: Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    from triton import knobs

    x = torch.zeros(64)
    kernel.pre_run_hooks.append(lambda *a, **k: None)
    _launch(kernel, x)
    _launch(kernel, x)
    kernel.pre_run_hooks.clear()
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        _launch(kernel, x)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    triton_tier.launch(kernel, (5,), object(), 64, 0.5, BLOCK=32, num_warps=4)  # a descriptor: no key
    triton_tier.launch(kernel, (5,), object(), 64, 0.5, BLOCK=32, num_warps=4)
    monkeypatch.setattr(triton_tier, "interpreting", lambda: True)
    _launch(kernel, x)
    _launch(kernel, x)
    assert len(kernel.triton_launches) == 7 and kernel.compiled.runs == []


@pytest.mark.gpu
def test_decode_attention_keeps_its_launch_across_key_counts_with_tritons_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode step's attention has a new key count (and cache strides) every step: each launch after the first of
    its int classes runs the kept kernel, and gives the bits of Triton's own launch of the same arguments."""
    from rl_kernel.fast.decoder import attention as fa

    monkeypatch.setattr(triton_tier, "_LAUNCHED", {})
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(4, 16, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    kv = torch.randn(2, 4, 8, 340, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k_start = torch.tensor([0, 3, 17, 40], device="cuda")

    def step(tk: int) -> torch.Tensor:
        k, v = kv[0, :, :, :tk].contiguous(), kv[1, :, :, :tk].contiguous()
        q_pos = torch.full((4, 1), tk - 1, device="cuda")
        return fa.forward(q, k, v, q_pos, k_start, 128**-0.5)[0]

    kept = [step(tk) for tk in range(300, 340)]
    assert len(triton_tier._LAUNCHED) <= 4  # one entry per int class met, not one per step
    monkeypatch.setattr(triton_tier, "_hooked", lambda kernel: True)  # every launch through Triton's own path
    own = [step(tk) for tk in range(300, 340)]
    for tk, a, b in zip(range(300, 340), kept, own, strict=True):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"tk = {tk}"
