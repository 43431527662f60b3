"""rl_kernel.head.parallel: vocab-parallel slices give the single-device bits (contract v2, docs/numerics.md 2).

The construction is checked in one process (each slice's kernels, the exchange a concatenation) on
every device, and across real processes with gloo (tp 2 and 4). Every equality is bitwise.
"""

from __future__ import annotations

import itertools
import os
import random
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rl_kernel
import rl_kernel.head.parallel as P
import rl_kernel.head.rowtree as T
from rl_kernel import inputs
from rl_kernel.bitwise import bits_equal, diff

IGNORE = -100
DTYPES = inputs.DTYPES
# (vocab, slice widths): equal, Megatron-padded (128 x tp), unequal, one tiny slice, a partial last chunk.
CUTS = [
    (151936, [75968, 75968]),
    (151936, [76032, 76032]),  # padded to 152064: 128 padding columns on rank 1
    (151936, [37984] * 4),
    (151936, [19008] * 8),  # padded to 152064
    (32003, [8000, 16000, 8003]),
    (4099, [4096, 3]),
    (4099, [8, 4091]),
    (1000, [504, 496]),
]


def assert_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert bits_equal(got, want), f"{what}: {diff(got, want).summary()}"


def padded_logits(rows: int, vocab: int, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[rows, width] logits whose columns past vocab hold a copy of real columns (as Megatron pads)."""
    x = inputs.logits(rows, vocab, dtype, seed=seed)
    if width > vocab:
        x = torch.cat([x, x.repeat(1, -(-(width - vocab) // vocab))[:, : width - vocab]], dim=-1)
    return x


def tokens_for(rows: int, vocab: int, seed: int) -> torch.Tensor:
    t = inputs.tokens(rows, vocab, seed=seed)
    t[::4] = IGNORE
    t[1] = vocab - 1  # the last real column, on the last rank
    return t


# ---- the layout ---------------------------------------------------------------------------------
@pytest.mark.parametrize("c0,c1", [(0, 1), (0, 18992), (3, 7), (5, 5), (1, 4096), (9496, 18992), (123, 4567)])
def test_decompose_tiles_the_range_with_maximal_aligned_nodes(c0: int, c1: int) -> None:
    nodes = T.decompose(c0, c1)
    at = c0
    for level, index in nodes:
        assert index << level == at, (nodes, at)
        at += 1 << level
        # maximal: the parent is not inside the range
        parent_lo, parent_hi = (index >> 1) << (level + 1), ((index >> 1) + 1) << (level + 1)
        assert not (parent_lo >= c0 and parent_hi <= c1), (level, index)
    assert at == c1
    assert len(nodes) <= 2 * max(1, (c1 - c0).bit_length())


@pytest.mark.parametrize(
    "slices,message",
    [
        ([T.Slice(0, 100, 200), T.Slice(100, 100, 200)], "multiple of 8"),
        # the rank whose slice ends mid-chunk is named, not the next one
        ([T.Slice(0, 96, 200), T.Slice(96, 100, 200), T.Slice(196, 4, 200)], r"rank 1 holds columns \[96, 196\)"),
        ([T.Slice(0, 96, 200), T.Slice(104, 96, 200)], "without gaps or overlaps"),
        ([T.Slice(0, 104, 200), T.Slice(96, 104, 200)], "without gaps or overlaps"),
        ([T.Slice(0, 96, 200), T.Slice(96, 96, 200)], "before vocab_size"),
        ([T.Slice(0, 96, 200), T.Slice(96, 104, 201)], "vocab_size differs"),
        ([T.Slice(0, 0, 200), T.Slice(0, 200, 200)], "holds no columns"),
        ([], "no slices"),
    ],
)
def test_bad_layouts_are_refused_by_name(slices: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        T.check_layout(slices)


def test_a_layout_in_any_rank_order_is_accepted() -> None:
    T.check_layout([T.Slice(96, 104, 200), T.Slice(0, 96, 200)])


# ---- one process: every slice's kernels, the exchange a concatenation ---------------------------------
@pytest.mark.parametrize("vocab,widths", CUTS, ids=[f"{v}-{len(w)}x{w[0]}" for v, w in CUTS])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_slices_give_the_single_device_bits(device: str, vocab: int, widths: list[int], dtype: torch.dtype) -> None:
    rows = 6
    x = padded_logits(rows, vocab, sum(widths), dtype, seed=vocab + len(widths)).to(device)
    x[2, 5] = float("-inf")  # a masked column
    tok = tokens_for(rows, vocab, seed=vocab).to(device)
    whole = x[:, :vocab].contiguous()
    locals_, slices = P.simulate(x, widths, vocab)
    stats = T.join_stats([T.local_stats(xl, s) for xl, s in zip(locals_, slices, strict=True)], slices)
    assert_bits(stats, rl_kernel.row_stats(whole), "row statistics")
    assert_bits(P.simulate_token_logprobs(x, tok, widths, vocab), rl_kernel.token_logprobs(whole, tok), "log-probs")
    assert_bits(P.simulate_entropy(x, widths, vocab), rl_kernel.entropy(whole), "entropy")


def even_cut(vocab: int, tp: int) -> list[int]:
    """tp slices of whole chunks as even as the vocabulary allows (the last one holds the partial chunk)."""
    chunks = -(-vocab // 8)
    per = [chunks // tp + (k < chunks % tp) for k in range(tp)]
    widths = [8 * c for c in per]
    widths[-1] -= 8 * chunks - vocab
    return widths


def cuts_for(vocab: int, tp: int) -> dict[str, tuple[list[int], int]]:
    """Equal (Megatron's cut where it exists, else even chunks), unequal (a random cut), and padded
    (every slice 128-aligned, as Megatron pads the vocabulary to 128 x tp): name -> (widths, padded width)."""
    rng = random.Random(vocab * 10 + tp)
    try:
        equal = P.megatron_widths(vocab, tp)
    except ValueError:
        equal = even_cut(vocab, tp)
    bounds = [0, *sorted(8 * c for c in rng.sample(range(1, -(-vocab // 8)), tp - 1)), vocab]
    unequal = [b - a for a, b in itertools.pairwise(bounds)]
    per = -(-vocab // (128 * tp)) * 128
    return {"equal": (equal, vocab), "unequal": (unequal, vocab), "padded": ([per] * tp, per * tp)}


VOCAB_SWEEP = (72, 1000, 4099, 32003, 50257, 128256, 151936, 152064)


@pytest.mark.slow
@pytest.mark.parametrize("vocab", VOCAB_SWEEP)
@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_sweep_split_equals_single_forward_and_backward(vocab: int, tp: int) -> None:
    """The Done-when sweep: vocabularies from a few dozen to 152064, 2/3/4/8 slices, equal, unequal and
    padded; log-probs, entropy and row statistics, and each slice's gradients, bit for bit."""
    rows = 3
    g = torch.randn(rows, generator=torch.Generator().manual_seed(vocab))
    for name, (widths, total) in cuts_for(vocab, tp).items():
        x = padded_logits(rows, vocab, total, torch.bfloat16, seed=vocab + tp)
        tok = tokens_for(rows, vocab, seed=vocab + tp)
        whole = x[:, :vocab].contiguous().requires_grad_()
        want_lp = rl_kernel.token_logprobs(whole, tok)
        (want_glp,) = torch.autograd.grad(want_lp, whole, g)
        want_h = rl_kernel.entropy(whole)
        (want_gh,) = torch.autograd.grad(want_h, whole, g)
        what = f"{name} widths {widths}"
        assert_bits(P.simulate_token_logprobs(x, tok, widths, vocab), want_lp.detach(), f"log-probs, {what}")
        assert_bits(P.simulate_entropy(x, widths, vocab), want_h.detach(), f"entropy, {what}")
        assert_bits(P.simulate_stats(x, widths, vocab), rl_kernel.row_stats(whole.detach()), f"stats, {what}")
        locals_, slices = P.simulate(x, widths, vocab)
        for me, (xl, s) in enumerate(zip(locals_, slices, strict=True)):
            leaf = xl.detach().clone().requires_grad_()
            lp = P._TokenLogprobs.apply(leaf, tok, slices, me, _fake_exchange(locals_, slices, me, tok), IGNORE)
            (got,) = torch.autograd.grad(lp, leaf, g)
            assert_bits(got[:, : s.valid], want_glp[:, s.start : s.start + s.valid], f"rank {me} lp grad, {what}")
            leaf = xl.detach().clone().requires_grad_()
            h = P._Entropy.apply(leaf, slices, me, _fake_exchange(locals_, slices, me, tok, entropy=True))
            (got,) = torch.autograd.grad(h, leaf, g)
            assert_bits(got[:, : s.valid], want_gh[:, s.start : s.start + s.valid], f"rank {me} entropy grad, {what}")
            assert not got[:, s.valid :].any(), f"padding got a gradient, {what}"


def test_padding_columns_are_ignored_whatever_they_hold(device: str) -> None:
    vocab, widths = 4099, [2048, 2056]
    x = padded_logits(4, vocab, sum(widths), torch.float32, seed=3).to(device)
    tok = tokens_for(4, vocab, seed=3).to(device)
    want = P.simulate_token_logprobs(x, tok, widths, vocab)
    for fill in (float("nan"), float("inf"), 1e30):
        y = x.clone()
        y[:, vocab:] = fill
        assert_bits(P.simulate_token_logprobs(y, tok, widths, vocab), want, f"padding {fill}")
        assert_bits(P.simulate_entropy(y, widths, vocab), rl_kernel.entropy(x[:, :vocab].contiguous()), "entropy")


def test_random_cuts_on_chunk_boundaries_give_the_single_device_bits(device: str) -> None:
    rng = random.Random(7)
    vocab = 32000
    x = inputs.logits(8, vocab, torch.bfloat16, seed=11).to(device)
    tok = tokens_for(8, vocab, seed=11).to(device)
    want_lp, want_h = rl_kernel.token_logprobs(x, tok), rl_kernel.entropy(x)
    for _ in range(12):
        cuts = sorted(rng.sample(range(1, vocab // 8), rng.randint(1, 7)))
        bounds = [0, *(8 * c for c in cuts), vocab]
        widths = [b - a for a, b in itertools.pairwise(bounds)]
        assert_bits(P.simulate_token_logprobs(x, tok, widths), want_lp, f"log-probs, widths {widths}")
        assert_bits(P.simulate_entropy(x, widths), want_h, f"entropy, widths {widths}")


def _children(nodes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each node of level >= 1 replaced by its two halves: a finer tiling of the same range."""
    return [c for lv, ix in nodes for c in (((lv - 1, 2 * ix), (lv - 1, 2 * ix + 1)) if lv else ((lv, ix),))]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_a_slices_nodes_by_any_tiling_join_to_the_same_bits(device: str, dtype: torch.dtype) -> None:
    """node_stats / node_entropy on a slice's canonical nodes (on the GPU: one block per row, balanced over
    its warps) and on a finer tiling of the same range (each node's two halves; one warp per node): every
    canonical node equals the join of its halves, and the two tilings join to the same bits."""
    vocab, widths = 151936, [75968, 37984, 37984]
    x = inputs.logits(6, vocab, dtype, seed=23).to(device)
    stats = rl_kernel.row_stats(x)
    locals_, slices = P.simulate(x, widths)
    ops = torch.ops.rl_kernel
    for local, own in zip(locals_, slices, strict=True):
        local = local.contiguous()
        lv, ix = [n[0] for n in own.nodes], [n[1] for n in own.nodes]
        fine = _children(own.nodes)
        flv, fix = [n[0] for n in fine], [n[1] for n in fine]
        canon = ops.node_stats(local, own.chunk0, own.valid, lv, ix)
        finer = ops.node_stats(local, own.chunk0, own.valid, flv, fix)
        at = 0
        for k, node in enumerate(own.nodes):
            halves = _children([node])
            got = ops.join_stats(finer[:, at : at + len(halves)].contiguous(), *map(list, zip(*halves, strict=True)))
            assert_bits(got, ops.join_stats(canon[:, k : k + 1].contiguous(), [node[0]], [node[1]]), f"node {node}")
            at += len(halves)
        assert_bits(ops.join_stats(finer, flv, fix), ops.join_stats(canon, lv, ix), f"slice at {own.start}")
        h_c = ops.node_entropy(local, stats, own.chunk0, own.valid, lv, ix)
        h_f = ops.node_entropy(local, stats, own.chunk0, own.valid, flv, fix)
        assert_bits(ops.join_sum(h_f, stats, flv, fix), ops.join_sum(h_c, stats, lv, ix), "entropy sums")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_a_slice_over_a_training_batch_gives_the_bits_of_a_few_rows(device: str, dtype: torch.dtype) -> None:
    """A fused head's vocabulary chunk over a training batch: on the GPU one warp per (row, canonical node) once
    the rows fill every warp (2048 rows; a few rows: one block per row). Both give the single-device bits, and
    the first rows alone equal the same rows in the batch."""
    rows, vocab, widths = 2048, 4099, [2048, 2051]
    x = inputs.logits(rows, vocab, dtype, seed=29).to(device)
    stats = rl_kernel.row_stats(x)
    locals_, slices = P.simulate(x, widths)
    ops = torch.ops.rl_kernel
    parts, sums = [], []
    for local, own in zip(locals_, slices, strict=True):
        local = local.contiguous()
        lv, ix = [n[0] for n in own.nodes], [n[1] for n in own.nodes]
        parts.append(ops.node_stats(local, own.chunk0, own.valid, lv, ix))
        sums.append(ops.node_entropy(local, stats, own.chunk0, own.valid, lv, ix))
        few = local[:6].contiguous()
        assert_bits(ops.node_stats(few, own.chunk0, own.valid, lv, ix), parts[-1][:6], f"nodes at {own.start}")
        got = ops.node_entropy(few, stats[:6].contiguous(), own.chunk0, own.valid, lv, ix)
        assert_bits(got, sums[-1][:6], f"entropy nodes at {own.start}")
    assert_bits(T.join_stats(parts, slices), stats, "row statistics")
    assert_bits(T.join_entropy(sums, stats, slices), rl_kernel.entropy(x), "entropy")


def test_negative_control_rank_order_merge_is_caught() -> None:
    """Per-rank sums merged in rank order (each slice reduced as a row of its own) differ from the row's
    tree: the comparison above can fail."""
    widths = [75968, 75968]
    x = inputs.logits(32, sum(widths), torch.float32, seed=5)
    wrong = P.simulate_stats(x, widths, rank_order=True)
    right = rl_kernel.row_stats(x)
    differ = (wrong[:, 1].view(torch.int32) != right[:, 1].view(torch.int32)).sum().item()
    assert differ >= 8, f"the rank-order merge changed the sum of only {differ} of 32 rows"


# ---- gradients -----------------------------------------------------------------------------------
def test_each_slice_gradient_is_the_slice_of_the_single_device_gradient(device: str) -> None:
    vocab, widths = 4099, [1024, 2048, 1032]  # padded to 4104
    x = padded_logits(6, vocab, sum(widths), torch.bfloat16, seed=9).to(device)
    tok = tokens_for(6, vocab, seed=9).to(device)
    g = torch.randn(6, generator=torch.Generator().manual_seed(1)).to(device)
    whole = x[:, :vocab].contiguous().requires_grad_()
    (want_lp,) = torch.autograd.grad(rl_kernel.token_logprobs(whole, tok), whole, g)
    (want_h,) = torch.autograd.grad(rl_kernel.entropy(whole), whole, g)
    locals_, slices = P.simulate(x, widths, vocab)
    for me, (xl, s) in enumerate(zip(locals_, slices, strict=True)):
        leaf = xl.detach().clone().requires_grad_()
        exchange = _fake_exchange(locals_, slices, me, tok)
        lp = P._TokenLogprobs.apply(leaf, tok, slices, me, exchange, IGNORE)
        (got,) = torch.autograd.grad(lp, leaf, g)
        assert_bits(got[:, : s.valid], want_lp[:, s.start : s.start + s.valid], f"token_logprobs grad, rank {me}")
        assert not got[:, s.valid :].any(), "padding columns got a gradient"
        leaf = xl.detach().clone().requires_grad_()
        h = P._Entropy.apply(leaf, slices, me, _fake_exchange(locals_, slices, me, tok, entropy=True))
        (got,) = torch.autograd.grad(h, leaf, g)
        assert_bits(got[:, : s.valid], want_h[:, s.start : s.start + s.valid], f"entropy grad, rank {me}")
        assert not got[:, s.valid :].any(), "padding columns got an entropy gradient"


def _fake_exchange(locals_, slices, me, tok, entropy=False):
    """The exchange one rank sees, with the other ranks' contributions computed here (in call order)."""
    stats = T.join_stats([T.local_stats(xl, s) for xl, s in zip(locals_, slices, strict=True)], slices)
    steps = [[T.padded(T.local_stats(xl, s), slices, -2) for xl, s in zip(locals_, slices, strict=True)]]
    if entropy:
        steps.append(
            [T.padded(T.local_entropy(xl, stats, s), slices, -1) for xl, s in zip(locals_, slices, strict=True)]
        )
    else:
        steps.append([T.local_token_logprobs(xl, tok, stats, s) for xl, s in zip(locals_, slices, strict=True)])
    calls = iter(steps)

    def exchange(t: torch.Tensor) -> list[torch.Tensor]:
        step = next(calls)
        assert bits_equal(t, step[me]), "this rank's contribution differs from the one-process construction"
        return step

    return exchange


# ---- real processes: gloo --------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, vocab: int, widths: list[int], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        x = padded_logits(6, vocab, sum(widths), torch.bfloat16, seed=21)
        tok = tokens_for(6, vocab, seed=21)
        start = sum(widths[:rank])
        local = x[:, start : start + widths[rank]].contiguous().requires_grad_()
        g = torch.randn(6, generator=torch.Generator().manual_seed(2))
        lp = rl_kernel.head.parallel.token_logprobs(local, tok, vocab_start=start, vocab_size=vocab)
        (glp,) = torch.autograd.grad(lp, local, g)
        h = rl_kernel.head.parallel.entropy(local, vocab_start=start, vocab_size=vocab)
        (gh,) = torch.autograd.grad(h, local, g)
        y, ty = padded_logits(64, vocab, sum(widths), torch.float32, seed=22), tokens_for(64, vocab, seed=22)
        ly = y[:, start : start + widths[rank]]
        stock = (
            P.sum_allreduce_token_logprobs(ly, ty, vocab_start=start, vocab_size=vocab),
            rl_kernel.head.parallel.token_logprobs(ly, ty, vocab_start=start, vocab_size=vocab),
        )
        torch.save({"lp": lp.detach(), "h": h.detach(), "glp": glp, "gh": gh, "stock": stock}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(
    "vocab,widths",
    [(32000, [16000, 16000]), (32000, [8000] * 4), (32003, [12000, 8000, 12008]), (151936, [19008] * 8)],
    ids=["tp2", "tp4", "unequal3", "tp8-padded-152064"],
)
def test_gloo_ranks_give_the_single_device_bits(tmp_path, vocab: int, widths: list[int]) -> None:
    out = str(tmp_path / "rank")
    mp.start_processes(
        _rank_main, args=(len(widths), _free_port(), vocab, widths, out), nprocs=len(widths), start_method="spawn"
    )
    x = padded_logits(6, vocab, sum(widths), torch.bfloat16, seed=21)
    tok = tokens_for(6, vocab, seed=21)
    g = torch.randn(6, generator=torch.Generator().manual_seed(2))
    whole = x[:, :vocab].contiguous().requires_grad_()
    want_lp = rl_kernel.token_logprobs(whole, tok)
    (want_glp,) = torch.autograd.grad(want_lp, whole, g)
    want_h = rl_kernel.entropy(whole)
    (want_gh,) = torch.autograd.grad(want_h, whole, g)
    stock_differs = False
    for rank in range(len(widths)):
        got = torch.load(f"{out}.{rank}")
        start, valid = sum(widths[:rank]), min(widths[rank], vocab - sum(widths[:rank]))
        assert_bits(got["lp"], want_lp.detach(), f"rank {rank} log-probs")
        assert_bits(got["h"], want_h.detach(), f"rank {rank} entropy")
        assert_bits(got["glp"][:, :valid], want_glp[:, start : start + valid], f"rank {rank} log-prob gradient")
        assert_bits(got["gh"][:, :valid], want_gh[:, start : start + valid], f"rank {rank} entropy gradient")
        assert not got["glp"][:, valid:].any() and not got["gh"][:, valid:].any(), "padding got a gradient"
        stock_differs |= not bits_equal(*got["stock"])
    # Information, not a gate elsewhere: the Megatron-style SUM all-reduce does not give these bits.
    assert stock_differs, "the SUM all-reduce path matched rl_kernel's bits: the control shows nothing"


def test_edge_rows_and_signed_zeros_give_the_single_device_bits(device: str) -> None:
    """The edge rows (NaN, +-inf, all -inf, subnormals, ...) and rows whose one finite value is -0.0 (its
    log-prob is -0.0 - 0 before the flush), each token on a different rank."""
    vocab, widths = 4099, [1032, 1032, 1032, 1003]
    x = inputs.edge_rows(vocab, torch.float32)
    zeros = torch.full((4, vocab), float("-inf"))
    cols = torch.tensor([5, 1500, 2600, 4098])
    zeros[torch.arange(4), cols] = -0.0
    x = torch.cat([x, zeros]).to(device)
    tok = torch.cat([torch.arange(x.shape[0] - 4) * 401 % vocab, cols]).to(device)
    # a row whose token's logit is a NaN of another payload: the log-prob is the canonical NaN, not that one
    payload = torch.full((1, vocab), 1.0, device=device)
    payload[0, 7] = torch.tensor(0x7FC0ABCD, dtype=torch.int32).view(torch.float32)
    x, tok = torch.cat([x, payload]), torch.cat([tok, torch.tensor([7], device=device)])
    assert_bits(P.simulate_token_logprobs(x, tok, widths), rl_kernel.token_logprobs(x, tok), "log-probs")
    assert_bits(P.simulate_entropy(x, widths), rl_kernel.entropy(x), "entropy")
    assert_bits(P.simulate_stats(x, widths), rl_kernel.row_stats(x), "row statistics")


@pytest.mark.parametrize("vocab,tp", [(151936, 2), (151936, 8), (32003, 4), (4099, 4), (1000, 2), (16, 2)])
def test_megatron_widths_cut_on_chunks_and_cover_the_vocabulary(vocab: int, tp: int) -> None:
    widths = P.megatron_widths(vocab, tp)
    assert len(widths) == tp and sum(widths) == vocab and min(widths) >= 1
    assert all(w % 8 == 0 for w in widths[:-1])
    T.check_layout([T.Slice(sum(widths[:k]), w, vocab) for k, w in enumerate(widths)])


def test_megatron_widths_refuse_a_cut_with_an_empty_rank() -> None:
    with pytest.raises(ValueError, match="cannot be cut into 4 slices"):
        P.megatron_widths(20, 4)
