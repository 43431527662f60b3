"""The bitwise suite: every equality is on integer views of the bits (rl_kernel.bitwise)."""

from __future__ import annotations

import pytest
import torch

from rl_kernel.bitwise import digest
from rlparity import golden
from rlparity.cell.controls import logprob_fn, stats_fn, token_fn
from rlparity.cell.episodes import (
    IGNORE,
    batch_views,
    rollout_logprobs,
    to_device,
    training_logprobs,
)
from rlparity.cell.placement import devices, slice_comparisons, split_tps, split_training
from rlparity.cell.suite.plugin import check_committed
from rlparity.cell.workloads import build_episode


def make_episode(shape, cell):
    return build_episode(cell.workload, *shape, cell.dtype, cell.seed)


def test_rollout_matches_training(cell, control, tier, record, shape):
    """Per-step decode log-probs (each step its own batch) == teacher-forced log-probs with autograd on."""
    ep = make_episode(shape, cell)
    lp = logprob_fn(control, tier)
    rollout_dev, train_dev = devices(cell.platform, cell.placement)
    rollout = rollout_logprobs(ep, lp, rollout_dev, cell.seed)
    training, grad = training_logprobs(ep, lp, train_dev)
    record.output(f"{golden.shape_id(shape, cell.workload)}/logprobs", training)
    record.output(f"{golden.shape_id(shape, cell.workload)}/grad", grad)
    d = record.compare(
        f"{golden.shape_id(shape, cell.workload)} rollout ({rollout_dev}) vs training ({train_dev})", rollout, training
    )
    assert d.equal, d.summary()


def test_batch_invariance(cell, control, tier, record, shape):
    """A row alone, the first rows as a small batch, in reversed batch order and as a strided view: the
    same bits as in the whole batch."""
    ep = make_episode(shape, cell)
    lp = logprob_fn(control, tier)
    dev = devices(cell.platform, cell.placement)[1]
    stats = stats_fn(control)
    views = batch_views(ep)
    x, tok, _ = views["batch"]
    reference = lp(to_device(x, dev), tok.to(dev)).cpu()
    reference_stats = stats(to_device(x, dev)).cpu()
    failures = []
    for name in ("alone", "head", "reversed", "strided"):
        vx, vtok, index = views[name]
        got = lp(to_device(vx, dev), vtok.to(dev)).cpu()
        got_stats = stats(to_device(vx, dev)).cpu()
        for what, a, b in (("logprobs", got, reference[index]), ("row stats", got_stats, reference_stats[index])):
            d = record.compare(f"{golden.shape_id(shape, cell.workload)} {name} vs batch {what}", a, b)
            if not d.equal:
                failures.append(f"{name} {what}: {d.summary()}")
    assert not failures, "; ".join(failures)


def test_run_to_run(cell, control, tier, record, shape):
    """The training path repeated (cell.repeats times in all): identical log-probs and gradients."""
    ep = make_episode(shape, cell)
    lp = logprob_fn(control, tier)
    dev = devices(cell.platform, cell.placement)[1]
    first_lp, first_grad = training_logprobs(ep, lp, dev)
    failures = []
    for i in range(1, cell.repeats):
        again_lp, again_grad = training_logprobs(ep, lp, dev)
        for what, a, b in (("logprobs", again_lp, first_lp), ("grad", again_grad, first_grad)):
            d = record.compare(f"{golden.shape_id(shape, cell.workload)} repeat {i} {what}", a, b)
            if not d.equal:
                failures.append(f"repeat {i} {what}: {d.summary()}")
    assert not failures, "; ".join(failures)


def test_golden_digests(cell, control, tier, record, shape):
    """The tier's committed digests (the same for every target in the exact tier)."""
    keys = {what: golden.key(cell.dtype, shape, cell.seed, what, cell.workload) for what in golden.OUTPUTS}
    dev = devices(cell.platform, cell.placement)[1]
    ep = make_episode(shape, cell)
    lp, grad = training_logprobs(ep, logprob_fn(control, tier), dev)
    stats = stats_fn(control)(to_device(ep.logits.reshape(-1, shape[2]), dev))
    actual = {"logprobs": digest(lp), "grad": digest(grad), "stats": digest(stats)}
    check_committed(cell, record, golden.shape_id(shape, cell.workload), keys, actual)


def test_split_matches_single(cell, control, tier, record, shape):
    """split placement: the vocabulary cut across tp ranks (vocab-parallel, rl_kernel.head.parallel), each rank
    holding only its slice of the logits: the gathered log-probs and gradient == the single-device run."""
    if cell.placement != "split":
        pytest.skip(f"placement is {cell.placement}, not split")
    ep = make_episode(shape, cell)
    single_lp, single_grad = training_logprobs(ep, logprob_fn(control, tier), devices(cell.platform, "single")[1])
    failures = []
    for tp in split_tps(cell.platform):
        split_lp, split_grad = split_training(shape, cell.dtype, cell.seed, cell.platform, control, cell.workload, tp)
        sid = golden.shape_id(shape, cell.workload)
        d_lp = record.compare(f"{sid} split tp{tp} vs single logprobs", split_lp, single_lp)
        d_grad = record.compare(f"{sid} split tp{tp} vs single grad", split_grad, single_grad)
        if not (d_lp.equal and d_grad.equal):
            failures.append(f"tp{tp} logprobs: {d_lp.summary()}; grad: {d_grad.summary()}")
    assert not failures, "; ".join(failures)


def test_vocab_slices_match_single(cell, control, record, shape):
    """The vocab-parallel construction on this cell's device in one process (each of tp = 2, 4 ranks'
    kernels on its slice, the exchange a byte copy): row statistics, log-probs and entropy == the
    single-device kernels. On a host with one GPU this is the GPU side of the split placement."""
    ep = make_episode(shape, cell)
    dev = devices(cell.platform, cell.placement)[1]
    vocab = shape[2]
    x = to_device(ep.logits.reshape(-1, vocab), dev)
    tok = ep.tokens.reshape(-1).to(dev)
    failures = []
    for name, (sliced, single) in slice_comparisons(x, tok, control).items():
        d = record.compare(f"{golden.shape_id(shape, cell.workload)} vocab slices {name}", sliced.cpu(), single.cpu())
        if not d.equal:
            failures.append(f"{name}: {d.summary()}")
    assert not failures, "; ".join(failures)


def test_token_contract(cell, control, record, shape):
    """ignore_index and out-of-range ids, as docs/numerics.md states them: an ignored position gives +0.0;
    with validate=False an id outside [0, V) gives NaN at its position (and the others are untouched);
    with validate=True the call raises ValueError."""
    ep = make_episode(shape, cell)
    dev = devices(cell.platform, cell.placement)[1]
    vocab = shape[2]
    x = to_device(ep.logits.reshape(-1, vocab)[:4], dev)
    valid = int(ep.tokens.reshape(-1)[0]) % vocab
    tok = torch.tensor([IGNORE, vocab, -1, valid], device=dev)
    lp = token_fn(control)
    got = lp(x, tok, False).cpu()
    expected = lp(x, torch.tensor([IGNORE, 0, 0, valid], device=dev), True).cpu()
    sid, failures = golden.shape_id(shape, cell.workload), []
    for name, a, b in (
        ("ignore_index gives +0.0", got[:1], torch.zeros(1)),
        (
            "out-of-range ids give NaN (validate=False)",
            got[1:3].isnan().to(torch.int8),
            torch.ones(2, dtype=torch.int8),
        ),
        ("an in-range id beside them is unchanged", got[3:], expected[3:]),
    ):
        d = record.compare(f"{sid} {name}", a, b)
        if not d.equal:
            failures.append(f"{name}: {d.summary()}")
    try:
        lp(x, tok, True)
        raised = "returned"
    except ValueError:
        raised = "ValueError"
    if not record.compare_digest(f"{sid} out-of-range ids raise (validate=True)", raised, "ValueError"):
        failures.append(f"validate=True with out-of-range ids {raised} instead of raising ValueError")
    assert not failures, "; ".join(failures)


def test_stock_pytorch_control(cell, record, shape):
    """Informational, never gated: what stock kernels do here (torch.log_softmax, torch.matmul), so the
    report shows what the deterministic kernels buy."""
    ep = make_episode(shape, cell)
    dev = devices(cell.platform, cell.placement)[1]

    def stock(x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        lp = torch.log_softmax(x.float(), dim=-1).gather(-1, tok.clamp_min(0)[:, None])[:, 0]
        return torch.where(tok == IGNORE, torch.zeros_like(lp), lp)

    rollout = rollout_logprobs(ep, stock, dev, cell.seed)
    training, _ = training_logprobs(ep, stock, dev)
    d1 = record.compare(
        f"{golden.shape_id(shape, cell.workload)} stock log_softmax rollout vs training",
        rollout,
        training,
        informational=True,
    )

    g = torch.Generator().manual_seed(cell.seed)
    dtype = ep.logits.dtype
    hidden = torch.randn(shape[0] * shape[1], 256, generator=g).to(dtype).to(dev)
    head = torch.randn(256, shape[2], generator=g).to(dtype).to(dev)
    d2 = record.compare(
        f"{golden.shape_id(shape, cell.workload)} stock matmul mm(a[:1], b) vs mm(a, b)[:1]",
        torch.mm(hidden[:1], head).cpu(),
        torch.mm(hidden, head)[:1].cpu(),
        informational=True,
    )
    assert d1.total == rollout.numel() and d2.total == shape[2]  # both comparisons ran over every element
