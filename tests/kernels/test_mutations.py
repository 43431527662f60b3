"""Contract mutations (rl_kernel.contract.mutations): one extra build carries deliberate violations of the contract
behind compile-time points, one switched on per process by RL_KERNEL_MUTATION. The committed golden digests
must see every mutation that can change an output (`python -m rl_kernel.contract.golden` exits 1), and the mutated
library with no mutation selected must give the golden digests (exit 0).

max_no_nan cannot change any output: a NaN in a row makes its sum of exps NaN whatever the max does, so the
row is bad either way (docs/architecture.md, "Mutations"). It is kept as a mutation for the harness (its
statistics trace shows the dropped NaN) and guarded statically by kernels_check's max/min rule."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rl_kernel import build_flags
from rl_kernel.contract import mutations

SEEN = [m for m in build_flags.mutation_names() if m not in build_flags.EQUIVALENT_MUTATIONS]
# Building the mutated library takes minutes: skip unless asked for, or in CI.
RUN = os.environ.get("RL_KERNEL_TEST_MUTATIONS") == "1" or os.environ.get("CI") == "true"
needs_build = pytest.mark.skipif(not RUN, reason="set RL_KERNEL_TEST_MUTATIONS=1 (builds the mutated library)")


def test_mutation_names_match_the_headers() -> None:
    """build_flags.mutation_names() is the list numerics.h's mutation_from_env() accepts, in its order."""
    text = (build_flags.PACKAGE / "exact" / "common" / "numerics.h").read_text()
    start = text.index("static const char* const names[]")
    listed = text[start : text.index("};", start)]
    names = [w.strip().strip('"') for w in listed.split("{", 1)[1].split(",")]
    assert tuple(n for n in names if n) == build_flags.mutation_names()


def test_a_variant_build_is_shared_by_every_clone_of_the_same_sources(monkeypatch) -> None:
    """variant_key leaves the checkout's folder out of the spec's paths (a fresh clone reuses the cached build);
    the spec's flags and sources still key it."""
    spec = mutations.build_spec(gpu=False, hip=False)
    here = mutations.variant_key(spec)
    elsewhere = str(build_flags.REPO)
    monkeypatch.setattr(build_flags, "REPO", build_flags.REPO.parent / "another-clone")
    moved = {**spec, "sources": [s.replace(elsewhere, str(build_flags.REPO)) for s in spec["sources"]]}
    assert moved != spec and mutations.variant_key(moved) == here
    assert mutations.variant_key({**moved, "cxx": [*moved["cxx"], "-ffp-contract=fast"]}) != here
    assert mutations.variant_key({**moved, "sources": moved["sources"][1:]}) != here


def test_build_spec_is_the_normal_build_plus_the_flag() -> None:
    spec = mutations.build_spec(gpu=False, hip=False)
    assert spec["cxx"] == [*build_flags.CXX_FLAGS, "-DRL_MUTATIONS"]
    assert [s.rsplit("/", 1)[-1] for s in spec["sources"]] == [s.rsplit("/", 1)[-1] for s in build_flags.sources(False)]
    gpu = mutations.build_spec(gpu=True, hip=False)
    assert gpu["device"] == [*build_flags.NVCC_FLAGS, "-DRL_MUTATIONS"]
    assert mutations.build_spec(gpu=True, hip=True)["device"] == [*build_flags.HIP_FLAGS, "-DRL_MUTATIONS"]


def test_env_refuses_unknown_names(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown mutation"):
        mutations.env(tmp_path / "x.so", "no_such_mutation")


@pytest.fixture(scope="module")
def library():
    return mutations.build()


def golden(library, mutation: str | None, device: str = "cpu") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rl_kernel.contract.golden", "--device", device],
        env=mutations.env(library, mutation),
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.slow
@needs_build
def test_unmutated_library_gives_the_golden_digests(library) -> None:
    proc = golden(library, None)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
@needs_build
@pytest.mark.parametrize("mutation", SEEN)
def test_golden_digests_see_the_mutation(library, mutation: str) -> None:
    proc = golden(library, mutation)
    assert proc.returncode == 1, f"{mutation} not seen by the golden digests:\n{proc.stdout}{proc.stderr}"
    assert "changed:" in proc.stdout


@pytest.mark.slow
@needs_build
def test_max_no_nan_changes_no_output(library) -> None:
    """The documented exception: the NaN-dropping max is invisible in every output (the NaN reaches the sum)."""
    proc = golden(library, "max_no_nan")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
@needs_build
def test_unknown_mutation_aborts(library) -> None:
    env = dict(os.environ, RL_KERNEL_LIBRARY=str(library), RL_KERNEL_MUTATION="no_such_mutation")
    code = "import rl_kernel, torch; rl_kernel.log_softmax(torch.zeros(2, 3))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "unknown RL_KERNEL_MUTATION" in proc.stderr


@pytest.mark.slow
@pytest.mark.gpu
def test_gpu_golden_digests_see_the_mutations(tmp_path) -> None:
    """On a GPU: the mutated library's GPU kernels (built with --gpu) show every seen mutation too."""
    lib = mutations.build(gpu=True)
    assert golden(lib, None, "cuda").returncode == 0
    for mutation in SEEN:
        assert golden(lib, mutation, "cuda").returncode == 1, mutation
