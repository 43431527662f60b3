"""Placements of one cell's work: which device(s) the rollout and the training path use, and the `split`
placement's vocab-parallel computation (torch.distributed: gloo on CPU, NCCL/RCCL on GPUs).

split cuts the vocabulary across tp ranks as a trainer does (rl_kernel.head.parallel.megatron_widths:
contiguous slices of ceil(V / tp) rounded to 8, the last rank the rest), each rank holding only its
columns of the logits; rl_kernel.head.parallel gives every rank the whole row's log-probs from node partials
exchanged by all-gather, and each rank's gradient is its slice. The gathered log-probs and gradient must
equal the single-device run bit for bit, for every tp the host can run (2 and 4 processes on the CPU;
on GPUs, one rank per visible device).
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlparity.cell.episodes import to_device
from rlparity.cell.workloads import build_episode
from rlparity.cells import DEFAULT_WORKLOAD


def devices(platform: str, placement: str) -> tuple[str, str]:
    """(rollout device, training device). The backend made the cell's devices visible as 0 and 1."""
    if platform == "cpu":
        return "cpu", "cpu"
    if placement == "dual-die":
        return "cuda:0", "cuda:1"
    return "cuda:0", "cuda:0"


def split_tps(platform: str) -> tuple[int, ...]:
    """The vocab-parallel sizes a split cell runs here: 2 and 4 gloo processes on the CPU, and on GPUs
    those that fit the visible devices (one rank each)."""
    if platform == "cpu":
        return (2, 4)
    return tuple(tp for tp in (2, 4) if tp <= torch.cuda.device_count())


def split_training(
    shape: tuple[int, int, int],
    dtype: str,
    seed: int,
    platform: str,
    control: str,
    workload: str = DEFAULT_WORKLOAD,
    tp: int = 2,
):
    """Teacher-forced log-probs and gradient computed by tp vocab-parallel ranks, gathered on rank 0."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gathered.pt"
        port = _free_port()
        mp.start_processes(
            _rank,
            args=(tp, shape, dtype, seed, platform, control, str(out), port, workload),
            nprocs=tp,
            start_method="spawn",
        )
        lp, grad = torch.load(out)
    return lp, grad


def _rank(rank: int, tp: int, shape, dtype, seed, platform, control, out, port, workload) -> None:
    import rl_kernel.head.parallel as vp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    gpu = platform != "cpu"
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=tp)
    try:
        device = f"cuda:{rank}" if gpu else "cpu"
        if gpu:
            torch.cuda.set_device(device)
        ep = build_episode(workload, *shape, dtype, seed)
        b, t, v = ep.shape
        widths = vp.megatron_widths(v, tp)
        start, width = sum(widths[:rank]), widths[rank]
        local = to_device(ep.logits, device)[..., start : start + width].reshape(b * t, width)
        local = local.detach().clone().requires_grad_()
        fn = vp.rank_order_token_logprobs if control == "rank-order" else vp.token_logprobs
        lp = fn(local, ep.tokens.view(-1).to(device), vocab_start=start, vocab_size=v).view(b, t)
        (lp * ep.advantages.to(device)).sum().backward()
        # All-gather needs equal shapes: every slice padded to the widest; rank 0 keeps each one's width.
        grad = torch.cat([local.grad, local.grad.new_zeros(b * t, max(widths) - width)], dim=-1).contiguous()
        grads = [torch.empty_like(grad) for _ in range(tp)]
        dist.all_gather(grads, grad)
        if rank == 0:
            full = torch.cat([g[:, :w].cpu() for g, w in zip(grads, widths, strict=True)], dim=-1)
            torch.save((lp.detach().cpu(), full.view(b, t, v)), out)
    finally:
        dist.destroy_process_group()


def slice_comparisons(x: torch.Tensor, tok: torch.Tensor, control: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The vocab-parallel construction in one process on x's device (each of tp ranks' kernels on its slice,
    the exchange a byte copy) against the single-device kernels: {name: (sliced, single)}."""
    import rl_kernel
    import rl_kernel.head.parallel as vp

    rank_order = control == "rank-order"
    single = {
        "stats": rl_kernel.row_stats(x),
        "logprobs": rl_kernel.token_logprobs(x, tok),
        "entropy": rl_kernel.entropy(x),
    }
    out = {}
    for tp in (2, 4):
        widths = vp.megatron_widths(x.shape[-1], tp)
        sliced = {
            "stats": vp.simulate_stats(x, widths, rank_order=rank_order),
            "logprobs": (vp.simulate_rank_order_token_logprobs if rank_order else vp.simulate_token_logprobs)(
                x, tok, widths
            ),
            "entropy": vp.simulate_entropy(x, widths),
        }
        out.update({f"tp{tp} {k}": (sliced[k], single[k]) for k in single})
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
