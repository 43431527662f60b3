"""Placements of one cell's work: which device(s) the rollout and the training path use, and the `split`
placement's sharded computation over two ranks (torch.distributed: gloo on CPU, NCCL/RCCL on GPUs).

split shards the teacher-forced batch by rows across two ranks and all-gathers the results in rank
order, so each row's reduction is whole on one rank and the gathered bits must equal the single-device
run. (Vocab-parallel sharding needs a lane-partials operator; see docs/harness.md.)
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlparity.cell.workloads import build_episode, training_logprobs
from rlparity.cells import DEFAULT_WORKLOAD


def devices(platform: str, placement: str) -> tuple[str, str]:
    """(rollout device, training device). The backend made the cell's devices visible as 0 and 1."""
    if platform == "cpu":
        return "cpu", "cpu"
    if placement == "dual-die":
        return "cuda:0", "cuda:1"
    return "cuda:0", "cuda:0"


def split_training(
    shape: tuple[int, int, int], dtype: str, seed: int, platform: str, control: str, workload: str = DEFAULT_WORKLOAD
):
    """Teacher-forced log-probs and gradient computed by two ranks, each on half of the rows."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gathered.pt"
        port = _free_port()
        mp.start_processes(
            _rank,
            args=(shape, dtype, seed, platform, control, str(out), port, workload),
            nprocs=2,
            start_method="spawn",
        )
        lp, grad = torch.load(out)
    return lp, grad


def _rank(rank: int, shape, dtype, seed, platform, control, out, port, workload) -> None:
    from rlparity.cell.controls import logprob_fn  # after spawn: the control's env is inherited

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    gpu = platform != "cpu"
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=2)
    try:
        device = f"cuda:{rank}" if gpu else "cpu"
        if gpu:
            torch.cuda.set_device(device)
        ep = build_episode(workload, *shape, dtype, seed)
        b, t, v = ep.shape
        rows = b * t
        per = -(-rows // 2)
        lo, hi = rank * per, min(rows, (rank + 1) * per)
        shard = _shard(ep, lo, hi)
        lp, grad = training_logprobs(shard, logprob_fn(control), device)
        # NCCL gathers device tensors (gloo CPU ones): inputs and outputs live on this rank's device.
        lp, grad = _pad(lp.view(-1), per).to(device), _pad(grad.view(-1, v), per).to(device)
        lps = [torch.empty_like(lp) for _ in range(2)]
        grads = [torch.empty_like(grad) for _ in range(2)]
        dist.all_gather(lps, lp)
        dist.all_gather(grads, grad)
        if rank == 0:
            lp_all = torch.cat([x.cpu() for x in lps])[:rows].view(b, t)
            grad_all = torch.cat([g.cpu() for g in grads])[:rows].view(b, t, v)
            torch.save((lp_all, grad_all), out)
    finally:
        dist.destroy_process_group()


def _shard(ep, lo: int, hi: int):
    """Rows lo..hi of the flattened batch as a one-sequence episode (row order kept)."""
    from rlparity.cell.workloads import Episode

    b, t, v = ep.shape
    x = ep.logits.reshape(b * t, v)[lo:hi].unsqueeze(0)
    tok = ep.tokens.reshape(-1)[lo:hi].unsqueeze(0)
    adv = ep.advantages.reshape(-1)[lo:hi].unsqueeze(0)
    return Episode(x, tok, (hi - lo,), adv)


def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
    if x.shape[0] == rows:
        return x.contiguous()
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
