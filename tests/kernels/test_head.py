"""rl_kernel.lm_head_logprobs: the fused LM head gives the unfused path's bits without the logits.

Forward (log-probs, entropy) and dWeight / dBias: bit for bit `head.unfused` (the tier's linear, the temperature
division generate() does, token_logprobs / entropy), at every vocabulary chunk width. dHidden: a fixed-order sum
of the chunks' fp32 partials, so batch invariant and run-to-run equal (checked bitwise) and accurate against
float64. Memory: the peak of tensors alive under torch's MemTracker, against the materialised logits. Every
equality compares integer views of the bits (rl_kernel.bitwise).
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rl_kernel
import rl_kernel.head.parallel as P
from rl_kernel import head, inputs, tiers
from rl_kernel.bitwise import bits_equal, diff
from rl_kernel.head import rowtree

IGNORE = -100


def assert_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert bits_equal(got, want), f"{what}: {diff(got, want).summary()}"


def case(rows: int, hidden: int, vocab_rows: int, dtype: torch.dtype, seed: int, vocab: int | None = None):
    """hidden [rows, H], weight [vocab_rows, H] (rows past vocab are padding), tokens with ignore_index and the
    last real column among them."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=g).to(dtype)
    w = (torch.randn(vocab_rows, hidden, generator=g) * hidden**-0.5 * 3).to(dtype)
    real = vocab or vocab_rows
    tok = torch.randint(0, real, (rows,), generator=g)
    tok[::5] = IGNORE
    if rows > 1:
        tok[1] = real - 1
    return h, w, tok


def exact_logits(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The unfused path's logits: the exact tier's linear."""
    return tiers.get("exact").op("linear")(h, w, None)


def run(fn, h, w, tok, bias=None, **kw):
    """(log-probs, entropy, dHidden, dWeight, dBias) of fn under loss = sum(a * logp) + sum(b * entropy)."""
    hg, wg = h.clone().requires_grad_(), w.clone().requires_grad_()
    bg = None if bias is None else bias.clone().requires_grad_()
    logp, ent = fn(hg, wg, tok, bias=bg, entropy=True, **kw)
    g = torch.Generator().manual_seed(7)
    a, b = (torch.randn(t.shape, generator=g).to(t.device) for t in (logp, ent))  # the weights drawn on the CPU
    ((logp * a).sum() + (ent * b).sum()).backward()
    return logp, ent, hg.grad, wg.grad, None if bg is None else bg.grad


SHAPES = [  # rows, hidden, weight rows, vocab (None: every row is real), chunk
    (6, 16, 40, None, 8),
    (5, 24, 301, 297, 64),  # odd sizes, padding rows
    (9, 32, 1000, None, 128),
    (3, 8, 4104, 4099, 4096),  # a partial last chunk of 8 columns
    (4, 8, 151936, None, head.VOCAB_CHUNK),
]


@pytest.mark.parametrize("rows,hidden,vrows,vocab,chunk", SHAPES)
@pytest.mark.parametrize("dtype", inputs.DTYPES, ids=inputs.dtype_name)
def test_fused_gives_the_unfused_bits(device, rows, hidden, vrows, vocab, chunk, dtype) -> None:
    h, w, tok = (t.to(device) for t in case(rows, hidden, vrows, dtype, seed=vrows, vocab=vocab))
    bias = (torch.randn(vrows, generator=torch.Generator().manual_seed(1)) * 0.5).to(dtype).to(device)
    for temperature in (None, 0.7):
        kw = {"vocab_size": vocab, "temperature": temperature}
        fused = run(head.lm_head_logprobs, h, w, tok, bias, vocab_chunk=chunk, **kw)
        plain = run(head.unfused, h, w, tok, bias, **kw)
        for name, i in (("log-probs", 0), ("entropy", 1), ("dWeight", 3), ("dBias", 4)):
            assert_bits(fused[i], plain[i], f"{name} T={temperature}")
        assert bool((fused[0][tok == IGNORE] == 0).all())
        # dHidden: another order than the unfused one (chunk partials), as accurate
        assert (fused[2].double() - plain[2].double()).abs().max() <= 2 * plain[2].double().abs().max() * 2**-7


def test_the_chunk_width_moves_no_forward_bit() -> None:
    """The vocabulary walk (numerics.md 12.3, what several ranks run) at any chunk width."""
    h, w, tok = case(7, 16, 2000, torch.bfloat16, seed=3)
    with head.one_chunk_per_call():
        want = head.lm_head_logprobs(h, w, tok, entropy=True, vocab_chunk=8)
    for chunk in (16, 248, 1000, 2000, 4096):
        with head.one_chunk_per_call():
            got = head.lm_head_logprobs(h, w, tok, entropy=True, vocab_chunk=chunk)
        assert_bits(got[0], want[0], f"log-probs, chunk {chunk}")
        assert_bits(got[1], want[1], f"entropy, chunk {chunk}")


@pytest.mark.parametrize("block_rows", [1, 3, 4, 100])
@pytest.mark.parametrize("temperature", [None, 0.7])
def test_the_row_blocks_forward_is_the_walks(monkeypatch, block_rows: int, temperature) -> None:
    """One device: whole rows in blocks (one GEMM per block, the unfused row kernels) give the walk's log-probs,
    entropy and row statistics, so the backward's bits too, at any block (a last block narrower)."""
    h, w, tok = case(10, 16, 1003, torch.bfloat16, seed=13, vocab=999)
    bias = (torch.randn(1003, generator=torch.Generator().manual_seed(2)) * 0.5).to(torch.bfloat16)
    kw = {"vocab_size": 999, "temperature": temperature, "vocab_chunk": 128}
    with head.one_chunk_per_call():
        want = run(head.lm_head_logprobs, h, w, tok, bias, **kw)
    monkeypatch.setattr(head, "row_block", lambda *a: block_rows)
    got = run(head.lm_head_logprobs, h, w, tok, bias, **kw)
    for name, i in (("log-probs", 0), ("entropy", 1), ("dHidden", 2), ("dWeight", 3), ("dBias", 4)):
        assert_bits(got[i], want[i], f"{name}, blocks of {block_rows} rows")


@pytest.mark.parametrize("block_rows", [1, 4])
def test_bad_rows_give_the_unfused_bits(monkeypatch, block_rows: int) -> None:
    """Rows whose logits hold a NaN, +inf (a bf16 overflow) or -inf (a masked column), in row blocks of any size:
    the fused forward's log-probs and entropy (taken from token_logprobs' statistics) are the unfused path's bits,
    NaN payloads included."""
    h, w, tok = case(6, 16, 203, torch.bfloat16, seed=21)
    h[1, 3] = float("nan")
    h[2] = 3e38  # every logit of the row overflows
    w[7] = float("-inf")  # column 7 is -inf or NaN in every row
    tok[2] = 7
    monkeypatch.setattr(head, "row_block", lambda *a: block_rows)
    fused = head.lm_head_logprobs(h, w, tok, entropy=True, validate=False)
    plain = head.unfused(h, w, tok, entropy=True)
    for name, got, want in (("log-probs", fused[0], plain[0]), ("entropy", fused[1], plain[1])):
        assert bool(want.isnan().any()), f"the control: the unfused {name} has no bad row"
        assert_bits(got, want, f"{name}, blocks of {block_rows} rows")


def test_tokens_out_of_range_without_validation_are_nan(monkeypatch) -> None:
    """validate=False: an id below 0 (not ignore_index) or past the vocabulary gives the canonical NaN, as the
    unfused token_logprobs does, in the walk (a join over chunks, where no chunk holds the id) and in row blocks."""
    h, w, tok = case(6, 16, 40, torch.bfloat16, seed=5)
    tok[0], tok[3] = -5, 43
    logits = exact_logits(h, w)
    want = rl_kernel.token_logprobs(logits, tok, validate=False)
    assert bool(want[[0, 3]].isnan().all()), "the control: the unfused path gives no NaN"
    with head.one_chunk_per_call():
        assert_bits(head.lm_head_logprobs(h, w, tok, vocab_chunk=8, validate=False), want, "log-probs, the walk")
    monkeypatch.setattr(head, "row_block", lambda *a: 4)
    assert_bits(head.lm_head_logprobs(h, w, tok, vocab_chunk=8, validate=False), want, "log-probs, row blocks")


def test_an_ignore_index_equal_to_the_chunk_width_is_kept_apart() -> None:
    """A chunk marks another chunk's token with a column it has not (its width); an ignore_index of that value
    must not turn such rows into ignored ones in the backward."""
    h, w, tok = case(7, 16, 48, torch.float32, seed=9)
    tok[::5] = 8
    fused = run(head.lm_head_logprobs, h, w, tok, vocab_chunk=8, ignore_index=8)
    plain = run(head.unfused, h, w, tok, ignore_index=8)
    for name, i in (("log-probs", 0), ("entropy", 1), ("dWeight", 3)):
        assert_bits(fused[i], plain[i], name)


def test_row_blocks_hold_a_sixteenth_of_the_logits_in_whole_tiles() -> None:
    assert head.row_block(8192, 151936, torch.bfloat16, None) == 512
    assert head.row_block(32768, 151936, torch.bfloat16, None) == 1536  # FORWARD_ELEMENTS caps it
    assert head.row_block(8192, 151936, torch.bfloat16, 0.7) == 170  # the fp32 copy: 6 bytes a logit, not 2
    assert head.row_block(10, 151936, torch.bfloat16, None) == 1
    big = head.row_block(1 << 22, 151936, torch.bfloat16, None)
    assert big * 151936 <= head.FORWARD_ELEMENTS and big % 256 == 0


def test_dhidden_is_batch_invariant_and_run_to_run_equal(device) -> None:
    h, w, tok = (t.to(device) for t in case(12, 32, 3000, torch.bfloat16, seed=5))
    full = run(head.lm_head_logprobs, h, w, tok, vocab_chunk=512)
    again = run(head.lm_head_logprobs, h, w, tok, vocab_chunk=512)
    assert_bits(again[2], full[2], "dHidden run to run")
    assert_bits(again[3], full[3], "dWeight run to run")
    # Rows 3..6 alone and in reverse order: their dHidden rows are the batch's (the loss weights follow the rows).
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(12, generator=g), torch.randn(12, generator=g)
    for idx in (torch.arange(3, 7), torch.arange(6, 2, -1)):
        hg = h[idx].clone().requires_grad_()
        logp, ent = head.lm_head_logprobs(hg, w, tok[idx], entropy=True, vocab_chunk=512)
        ((logp * a[idx].to(device)).sum() + (ent * b[idx].to(device)).sum()).backward()
        assert_bits(hg.grad, full[2][idx], f"dHidden of rows {idx.tolist()}")


def test_dhidden_is_accurate_against_float64() -> None:
    h, w, tok = case(6, 16, 1000, torch.float32, seed=9)
    got = run(head.lm_head_logprobs, h, w, tok, vocab_chunk=64)[2]
    hd, wd = h.double().requires_grad_(), w.double()
    logits = hd @ wd.t()
    lsm = torch.log_softmax(logits, -1)
    keep = tok != IGNORE
    logp = torch.where(keep, lsm.gather(-1, tok.clamp(min=0).unsqueeze(-1)).squeeze(-1), torch.zeros(()))
    ent = -(lsm.exp() * lsm).sum(-1)
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(6, generator=g).double(), torch.randn(6, generator=g).double()
    ((logp * a).sum() + (ent * b).sum()).backward()
    assert (got.double() - hd.grad).abs().max() <= 1e-5 * hd.grad.abs().max()


def test_dhidden_is_one_rounding_of_the_chunks_fp32_sum() -> None:
    """Over 512 chunks, dHidden is within one rounding of the exact product of the unfused logit gradient and the
    weight: the chunks' partials are added in fp32 and rounded once, never rounded per chunk."""
    h, w, tok = case(8, 32, 4096, torch.bfloat16, seed=12)
    dh = run(head.lm_head_logprobs, h, w, tok, vocab_chunk=8)[2]
    logits = exact_logits(h, w).requires_grad_()
    logp, ent = rl_kernel.token_logprobs(logits, tok), rl_kernel.entropy(logits)
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(8, generator=g), torch.randn(8, generator=g)
    ((logp * a).sum() + (ent * b).sum()).backward()
    exact = logits.grad.double() @ w.double()  # the logit gradient is the unfused one (test above), its bits
    ulp = (exact.abs().float().bfloat16().float().view(torch.int32) + (1 << 16)).view(torch.float32).double()
    ulp = ulp - exact.abs().float().bfloat16().double()  # one bf16 ulp at each element's magnitude
    err = (dh.double() - exact).abs()
    assert bool((err <= 0.5 * ulp + exact.abs() * 2**-20 + 2**-133).all()), float((err / ulp).max())


def test_dhidden_adds_the_chunks_partials_left_to_right() -> None:
    """fp32, 5 chunks: dHidden is bit for bit 0 + p0 + p1 + ... + p4, each p_c the exact linear kernel's fp32 product
    of chunk c's logit gradient and weight rows, added in column order (numerics.md 12.3). In fp32 no final rounding
    hides the order: the chunks added right to left (or as a tree) give other bits."""
    h, w, tok = case(9, 24, 40, torch.float32, seed=21)
    dh = run(head.lm_head_logprobs, h, w, tok, vocab_chunk=8)[2]
    logits = exact_logits(h, w).requires_grad_()
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(9, generator=g), torch.randn(9, generator=g)
    ((rl_kernel.token_logprobs(logits, tok) * a).sum() + (rl_kernel.entropy(logits) * b).sum()).backward()
    parts = [rl_kernel.linear(logits.grad[:, c : c + 8], w[c : c + 8].t().contiguous()) for c in range(0, 40, 8)]
    left_to_right = torch.zeros_like(dh)
    for p in parts:
        left_to_right = left_to_right + p
    assert_bits(dh, left_to_right, "dHidden: the chunks' fp32 partials added left to right")
    right_to_left = torch.zeros_like(dh)
    for p in reversed(parts):
        right_to_left = right_to_left + p
    assert not bits_equal(left_to_right, right_to_left), "the case cannot tell the order: pick another seed"


@pytest.mark.parametrize("chunks_per_call", [2, 3, 200])
def test_calls_of_several_chunks_give_the_bits_of_one_chunk_per_call(monkeypatch, chunks_per_call: int) -> None:
    """The walk takes as many chunks per call as the tier's call_elements allows: every output the same bits,
    dHidden still the chunks' fp32 partials left to right (fp32: the order shows), the last call narrower."""
    h, w, tok = case(9, 24, 1000, torch.float32, seed=21)
    want = run(head.lm_head_logprobs, h, w, tok, vocab_chunk=64)
    exact = tiers.get("exact")
    wide = dataclasses.replace(exact.head_gemms(), call_elements=9 * 64 * chunks_per_call)
    assert head.span_of(wide, 9, 64) == 64 * chunks_per_call
    monkeypatch.setattr(tiers.Tier, "head_gemms", lambda self: wide)
    got = run(head.lm_head_logprobs, h, w, tok, vocab_chunk=64)
    for name, i in (("log-probs", 0), ("entropy", 1), ("dHidden", 2), ("dWeight", 3)):
        assert_bits(got[i], want[i], f"{name}, {chunks_per_call} chunks per call")


def test_only_the_used_output_has_a_gradient() -> None:
    """An unused entropy output takes no part in the backward: dWeight is that of the log-probs alone."""
    h, w, tok = case(5, 16, 300, torch.bfloat16, seed=2)
    hg, wg = h.clone().requires_grad_(), w.clone().requires_grad_()
    logp, _ = head.lm_head_logprobs(hg, wg, tok, entropy=True, vocab_chunk=64)
    logp.sum().backward()
    plain = run_logp_only(h, w, tok)
    assert_bits(wg.grad, plain, "dWeight with the entropy unused")


def run_logp_only(h, w, tok) -> torch.Tensor:
    wg = w.clone().requires_grad_()
    head.unfused(h, wg, tok).sum().backward()
    return wg.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=inputs.dtype_name)
def test_one_pass_logit_gradient_is_autograds_sum_of_the_two(device, dtype) -> None:
    """logprobs_entropy_backward_slice == token_logprobs_backward_slice + entropy_backward_slice as torch adds them
    (each rounded to the logits' dtype, then added): on a slice with padding columns, an ignored token, a token of
    another slice, a NaN row and masked (-inf) columns."""
    from rl_kernel._library import ops

    g = torch.Generator().manual_seed(11)
    rows, width, valid = 7, 200, 193
    z = (torch.randn(rows, width, generator=g) * 4).to(dtype)
    z[2, 5] = float("nan")
    z[3, :40] = float("-inf")
    tok = torch.randint(0, valid, (rows,), generator=g)
    tok[0], tok[1] = IGNORE, width + 3  # ignored; a token of another slice
    z, tok = z.to(device), tok.to(device)
    stats = ops.join_stats(*_one_node_per_row(z, valid))
    ent = ops.join_sum(ops.node_entropy(z, stats, 0, valid, [6], [0]), stats, [6], [0])
    g_logp, g_ent = (torch.randn(rows, generator=g).to(device) for _ in range(2))
    both = ops.logprobs_entropy_backward_slice(g_logp, g_ent, z, tok, stats, ent, IGNORE, valid)
    one = ops.token_logprobs_backward_slice(g_logp, z, tok, stats, IGNORE, valid)
    other = ops.entropy_backward_slice(g_ent, z, stats, ent, valid)
    summed = one + other
    assert torch.equal(both.isnan(), summed.isnan()) and bool(both[2, :valid].isnan().all()), "the NaN row"
    # A NaN's payload is the adder's (torch's vectorised CPU bf16 add writes 0xffff, a GPU fp32 add 0x7fffffff): the
    # head's consumers canonicalise or propagate it, so every other bit is compared.
    nan = rowtree.canonical_nan(dtype, z.device)
    assert_bits(torch.where(both.isnan(), nan, both), torch.where(summed.isnan(), nan, summed),
                f"{dtype} one pass vs the two backwards added")  # fmt: skip
    with pytest.raises(RuntimeError, match="fp32 or bf16 logits, got fp16"):
        ops.logprobs_entropy_backward_slice(g_logp, g_ent, z.half(), tok, stats, ent, IGNORE, valid)


def _one_node_per_row(z: torch.Tensor, valid: int) -> tuple[torch.Tensor, list[int], list[int]]:
    """A slice of `valid` <= 256 columns as the row tree's one node of level 5 (256 columns): its statistics."""
    from rl_kernel._library import ops

    return ops.node_stats(z, 0, valid, [5], [0]), [5], [0]


def test_the_public_name_is_the_fused_head() -> None:
    assert rl_kernel.lm_head_logprobs is head.lm_head_logprobs


def test_shapes_are_kept() -> None:
    h, w, tok = case(6, 16, 100, torch.bfloat16, seed=4)
    out = head.lm_head_logprobs(h.view(2, 3, 16), w, tok.view(2, 3))
    assert out.shape == (2, 3) and out.dtype == torch.float32
    assert_bits(out.view(-1), head.lm_head_logprobs(h, w, tok), "[2, 3] == [6]")


# ---- vocab-parallel ranks ------------------------------------------------------------------------------------
def test_one_rank_is_the_single_device_head() -> None:
    """Without torch.distributed a rank holds the whole vocabulary: rl_kernel.head.parallel.lm_head_logprobs is the
    single-device fused head, dHidden included."""
    h, w, tok = case(6, 16, 1000, torch.bfloat16, seed=8)
    fused = run(head.lm_head_logprobs, h, w, tok, vocab_chunk=128)
    par = run(P.lm_head_logprobs, h, w, tok, vocab_chunk=128, vocab_start=0, vocab_size=1000)
    for name, i in (("log-probs", 0), ("entropy", 1), ("dHidden", 2), ("dWeight", 3)):
        assert_bits(par[i], fused[i], name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, widths: list[int], vocab: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        h, w, tok = case(5, 16, sum(widths), torch.bfloat16, seed=4, vocab=vocab)
        start = sum(widths[:rank])
        got = run(P.lm_head_logprobs, h, w[start : start + widths[rank]], tok, vocab_chunk=64, vocab_start=start,
                  vocab_size=vocab, temperature=0.9)  # fmt: skip
        torch.save(got[:4], f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("vocab,widths", [(1000, [504, 496]), (997, [256, 496, 152, 96])], ids=["tp2", "tp4-padded"])
def test_gloo_ranks_give_the_single_device_bits(tmp_path, vocab: int, widths: list[int]) -> None:
    """Real processes (gloo): every rank's log-probs and entropy are the single-device fused head's bits, its
    dWeight its rows of the single-device one; dHidden the same on every rank and accurate."""
    out = str(tmp_path / "rank")
    mp.start_processes(
        _rank_main, args=(len(widths), _free_port(), widths, vocab, out), nprocs=len(widths), start_method="spawn"
    )
    h, w, tok = case(5, 16, sum(widths), torch.bfloat16, seed=4, vocab=vocab)
    want = run(head.lm_head_logprobs, h, w, tok, vocab_chunk=64, vocab_size=vocab, temperature=0.9)
    first = None
    for rank in range(len(widths)):
        lp, ent, dh, dw = torch.load(f"{out}.{rank}")
        start = sum(widths[:rank])
        assert_bits(lp, want[0], f"rank {rank} log-probs")
        assert_bits(ent, want[1], f"rank {rank} entropy")
        assert_bits(dw, want[3][start : start + widths[rank]], f"rank {rank} dWeight rows")
        first = dh if first is None else first
        assert_bits(dh, first, f"rank {rank} dHidden == rank 0's")
    assert (first.double() - want[2].double()).abs().max() <= want[2].double().abs().max() * 2**-6


# ---- memory ---------------------------------------------------------------------------------------------
def peak_bytes(fn) -> int:
    """The peak of the CPU tensors alive while fn runs (torch's MemTracker: every tensor the dispatcher makes)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    with tracker:
        fn()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.slow
def test_peak_memory_is_an_eighth_of_the_logits() -> None:
    """Training (forward + backward) at a 151936 vocabulary: the fused head's peak, dWeight included, stays under
    1/8 of the [rows, vocab] bf16 logits it never makes; the unfused path (the control) holds them."""
    rows, hid, vocab = 384, 8, 151936
    h, w, tok = case(rows, hid, vocab, torch.bfloat16, seed=1)
    logits_bytes = rows * vocab * 2

    def train(fn):
        def step():
            hg, wg = h.clone().requires_grad_(), w.clone().requires_grad_()
            logp, ent = fn(hg, wg, tok, entropy=True)
            (logp.sum() + ent.sum()).backward()

        return step

    fused = peak_bytes(train(head.lm_head_logprobs))
    plain = peak_bytes(train(head.unfused))
    assert plain >= logits_bytes, f"the tracker missed the unfused logits: peak {plain} < {logits_bytes}"
    assert fused <= logits_bytes / 8, f"fused head peak {fused} bytes > 1/8 of the logits ({logits_bytes} bytes)"


def test_dweight_is_held_once() -> None:
    """The backward stores each chunk's rows of dWeight into one preallocated gradient: at a head whose dWeight
    outweighs everything else, the peak is the weight the head saves and one dWeight (2.1x the weight's bytes; a
    list of chunks joined at the end held two dWeights: 3.0x)."""
    rows, hid, vocab = 16, 512, 16384
    h, w, tok = case(rows, hid, vocab, torch.bfloat16, seed=2)
    wg = w.clone().requires_grad_()
    w_bytes = vocab * hid * 2

    def step():
        logp = head.lm_head_logprobs(h, wg, tok)
        logp.sum().backward()

    peak = peak_bytes(step)
    assert wg.grad is not None and wg.grad.shape == w.shape
    assert peak < 2.5 * w_bytes, f"peak {peak} bytes: weight + dWeight ({2 * w_bytes} bytes) and more than that"


# ---- bad input --------------------------------------------------------------------------------------------
def _bad(**change):
    h, w, tok = case(4, 16, 64, torch.bfloat16, seed=0)
    args = {"hidden": h, "weight": w, "tokens": tok} | change
    kw = {k: args.pop(k) for k in list(args) if k not in ("hidden", "weight", "tokens")}
    return lambda: head.lm_head_logprobs(args["hidden"], args["weight"], args["tokens"], **kw)


@pytest.mark.parametrize(
    "change,error,words",
    [
        ({"weight": torch.zeros(64, 8, dtype=torch.bfloat16)}, ValueError, "hidden size 8"),
        ({"weight": torch.zeros(64, dtype=torch.bfloat16)}, ValueError, "weight must be [vocab, hidden]"),
        ({"weight": torch.zeros(64, 16)}, TypeError, "weight is torch.float32 but hidden is torch.bfloat16"),
        ({"bias": torch.zeros(63, dtype=torch.bfloat16)}, ValueError, "bias must be [64]"),
        ({"tokens": torch.tensor([0, 1, 64, 2])}, ValueError, "token id 64"),
        ({"tokens": torch.tensor([0, 1, 2])}, ValueError, "tokens shape"),
        ({"tokens": torch.zeros(4)}, TypeError, "integer tensor"),
        ({"vocab_size": 65}, ValueError, "vocab_size 65"),
        ({"vocab_size": 50, "tokens": torch.tensor([0, 1, 55, 2])}, ValueError, "outside the vocabulary [0, 50)"),
        ({"vocab_chunk": 12}, ValueError, "vocab_chunk"),
        ({"temperature": 0.0}, ValueError, "temperature"),
        ({"tier": "nope"}, LookupError, "nope"),
        ({"hidden": torch.zeros(4, 16, dtype=torch.float64)}, TypeError, "hidden is torch.float64"),
    ],
)
def test_bad_input_names_the_argument(change, error, words) -> None:
    with pytest.raises(error, match=re.escape(words)):
        _bad(**change)()


def test_the_fast_tier_on_the_cpu_names_the_exact_tier(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="tier='exact'"):
        _bad(tier="fast")()
