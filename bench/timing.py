"""The one timer of bench/: every benchmark measures through these functions, in seconds.

The project's standard times every contender two ways, side by side in one process, each the median of many runs
after a warm-up:
- synced: a host synchronisation before and after every call, wall clock (time.perf_counter): what a caller that
  waits for each result pays, the launch path included;
- queued: the calls issued back to back (contenders round robin), device events around each call, one
  synchronisation at the end: the device's time, the host's launch cost hidden when the device is the slower.
Device-neutral: CUDA and ROCm builds of torch both drive the GPU through torch.cuda (HIP events are CUDA events
there). Without a GPU both fall back to time.perf_counter around each call (the benchmarks' CPU runs, which
check the scripts, not the speed). Beside them: `host` (the launch path alone), `captured` (a CUDA/HIP graph of a
call, whose replay is then timed like any contender) and `kernels` (torch.profiler's device time per kernel).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import torch

WARMUP = 3  # calls of each contender before timing (Triton compiles, cuBLAS/hipBLAS handles, allocator caches)
Fns = Mapping[str, Callable[[], object]]


def gpu() -> bool:
    return torch.cuda.is_available()


def sync() -> None:
    if gpu():
        torch.cuda.synchronize()


def warm(fns: Fns, warmup: int = WARMUP) -> None:
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync()


def _rounds(fns: Fns, reps: int, warmup: int, sync_after: bool) -> dict[str, list[float]]:
    """perf_counter seconds of each call of each contender, round robin, a host sync before each call (and after it
    with sync_after)."""
    warm(fns, warmup)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            if sync_after:
                sync()
            times[k].append(time.perf_counter() - t0)
    sync()
    return times


def _wall(fns: Fns, reps: int, warmup: int, sync_after: bool) -> dict[str, float]:
    """Median perf_counter seconds of one call of each contender (_rounds)."""
    return {k: statistics.median(v) for k, v in _rounds(fns, reps, warmup, sync_after).items()}


def paired(fns: Fns, reps: int, baseline: str, warmup: int = 1) -> dict:
    """The contenders in turn, `reps` rounds, synced: each one's seconds, their median, and the median over the
    rounds of its time over the baseline's in the same round (a figure that a host drifting between contenders
    moves less than a ratio of medians)."""
    times = _rounds(fns, reps, warmup, sync_after=True)
    return {
        "rounds": reps,
        "seconds": times,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        f"paired_over_{baseline}": {
            k: statistics.median(a / b for a, b in zip(v, times[baseline], strict=True)) for k, v in times.items()
        },
    }


def synced(fns: Fns, reps: int, warmup: int = WARMUP) -> dict[str, float]:
    """Median seconds of one call of each contender with a host sync before and after it."""
    return _wall(fns, reps, warmup, sync_after=True)


def queued(fns: Fns, reps: int, warmup: int = WARMUP) -> dict[str, float]:
    """Median seconds of one call of each contender, every call queued behind the others (events around each,
    one sync at the end); on the CPU, perf_counter around each call."""
    warm(fns, warmup)
    if not gpu():
        return synced(fns, reps, warmup=0)
    events: dict[str, list] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events[k].append((start, end))
    torch.cuda.synchronize()
    return {k: statistics.median(a.elapsed_time(b) * 1e-3 for a, b in v) for k, v in events.items()}


def both(fns: Fns, reps: int, warmup: int = WARMUP) -> dict[str, dict[str, float]]:
    """{contender: {"synced_s": ..., "queued_s": ...}}: one warm-up, then both measurements."""
    warm(fns, warmup)
    s, q = synced(fns, reps, warmup=0), queued(fns, reps, warmup=0)
    return {k: {"synced_s": s[k], "queued_s": q[k]} for k in fns}


def host(fns: Fns, reps: int, warmup: int = WARMUP) -> dict[str, float]:
    """Median seconds the host spends in one call (a sync before it, none after): the launch path alone."""
    return _wall(fns, reps, warmup, sync_after=False)


def captured(fn: Callable[[], object], calls: int = 1) -> tuple[Callable[[], object] | None, str]:
    """(replay, "") of a CUDA/HIP graph of `calls` calls of fn (warmed on a side stream outside the capture), or
    (None, why) when fn cannot be captured. Timing the replay shows the device's time without the host's launch
    path (how a rollout engine that captures its decode step pays for it); divide by `calls`."""
    if not gpu():
        return None, "no GPU: graphs need CUDA or ROCm"
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except Exception as exc:  # a call that syncs, allocates on the host or launches outside the stream
        return None, repr(exc)[:300]
    return graph.replay, ""


def kernels(fn: Callable[[], object], reps: int = 50) -> dict[str, float]:
    """Mean device seconds per call of each kernel fn launches (torch.profiler; CUDA and ROCm alike)."""
    from torch.profiler import ProfilerActivity, profile

    warm({"fn": fn})
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        sync()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            out[e.key[:90]] = t * 1e-6 / reps
    return out


def host_ops(fn: Callable[[], object], reps: int = 5, top: int = 15) -> dict[str, dict[str, float]]:
    """The host's side of a call (torch.profiler's CPU activity): per op and runtime call (cudaLaunchKernel,
    cudaStreamSynchronize, cudaMemcpyAsync...), its self CPU seconds and count per call, the `top` largest. Where a
    synced time exceeds the sum of its kernels, this names what the host spent the gap on."""
    prof = trace(fn, reps)
    rows = {
        e.key[:90]: {"self_cpu_s": e.self_cpu_time_total * 1e-6 / reps, "count": e.count / reps}
        for e in prof.key_averages()
        if e.self_cpu_time_total > 0
    }
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]["self_cpu_s"])[:top])


def syncs(fn: Callable[[], object], depth: int = 3) -> dict[str, int]:
    """Where one call of fn makes the host wait for the GPU: {the Python frames of each synchronising call (the
    innermost `depth` outside torch, innermost first): how many times}, from torch.cuda's sync debug mode (a .item(),
    a bool() of a device tensor, a copy of a pageable host tensor to the device...). Empty without a GPU."""
    import traceback
    import warnings

    if not gpu():
        return {}
    found: dict[str, int] = {}

    def seen(*_args, **_kwargs) -> None:
        frames = [f for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename and f.name != "syncs"]
        where = " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in frames[::-1][:depth])
        found[where] = found.get(where, 0) + 1

    warm({"fn": fn}, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = seen
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sync()
    return found


def trace(fn: Callable[[], object], calls: int = 1):
    """torch.profiler over `calls` calls of fn (the CPU's ops, and the device's kernels where there is a GPU), synced
    at the end; the profile, for a benchmark that attributes kernels itself (profile_step)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu() else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        sync()
    return prof
