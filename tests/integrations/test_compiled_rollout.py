"""generate(cache_implementation="static") with the compiled decode step (issue 30: torch.compile, inductor, as
transformers compiles it on a GPU; asked for on the CPU with CompileConfig's _compile_all_devices) on a patched
model: one graph for every decode step, its logits equal the teacher-forced forward's bit for bit (the exact tier,
both transformers ends). The negative control: the same compile without rl_kernel's exact options (inductor keeps
bf16 intermediates in fp32 across the ops it fuses) gives other bits."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch._dynamo.utils import counters

from rl_kernel import models
from rl_kernel.bitwise import bits_equal, diff
from rl_kernel.integrations import generation
from rl_kernel.integrations import transformers as hf
from rlparity.cell.workloads import model as M

VOCAB, NEW = 211, 5
pytestmark = pytest.mark.slow  # an inductor compile of the decode step each (C++ on the CPU)


def compiled_generate(model, p: M.Prompts) -> M.Rollout:
    config = transformers.CompileConfig(fullgraph=True)  # transformers' default mode (reduce-overhead), no breaks
    config._compile_all_devices = True  # transformers compiles on a GPU by itself; the CPU must ask
    torch.compiler.reset()
    counters.clear()
    with torch.no_grad():
        out = model.generate(p.ids, attention_mask=p.mask, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, max_new_tokens=NEW, min_new_tokens=NEW,
                             pad_token_id=models.PAD, cache_implementation="static", compile_config=config)  # fmt: skip
    return M.Rollout(out.sequences, torch.stack(out.logits, 1).float(), p.ids.shape[1])


@pytest.mark.parametrize(("family", "dtype"), [("qwen3", "bf16"), ("llama", "fp32"), ("qwen2", "bf16")])
def test_compiled_static_generate_equals_the_forward(family: str, dtype: str) -> None:
    model = models.tiny_model(family, VOCAB, tier="exact", dtype=dtype)
    p = M.prompts(5, VOCAB, 0)
    r = compiled_generate(model, p)
    assert "_rl_compiled" in model.__dict__, "generate() did not take the patched model's compiled call"
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])  # every decode step: one graph
    for view, logits in M.forward_views(model, r, p, "cpu").items():
        assert bits_equal(r.logits, logits), f"{family} {dtype} {view}: {diff(r.logits, logits).summary()}"


def test_inductor_without_the_exact_options_changes_the_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generation, "exact_compile_options", lambda backend, mode, options: (mode, options))
    model = models.tiny_model("qwen3", VOCAB, tier="exact", dtype="bf16")
    p = M.prompts(5, VOCAB, 0)
    r = compiled_generate(model, p)
    assert not bits_equal(r.logits, M.forward_views(model, r, p, "cpu")["batch, left padded"])
    hf.unpatch(model)
    assert not {"get_compiled_call", "_rl_compiled"} & set(model.__dict__)  # unpatch takes the compiled call away


@pytest.mark.parametrize(
    ("backend", "mode", "options", "want"),
    [
        ("inductor", "reduce-overhead", None, (None, {"triton.cudagraphs": True, "emulate_precision_casts": True})),
        ("inductor", None, {"max_autotune": True}, (None, {"max_autotune": True, "emulate_precision_casts": True})),
        ("aot_eager", "reduce-overhead", None, ("reduce-overhead", None)),  # no fusion there: left as asked
    ],
)
def test_exact_compile_options(backend: str, mode: str | None, options: dict | None, want: tuple) -> None:
    assert generation.exact_compile_options(backend, mode, options) == want


def test_the_mask_hook_pads_to_the_static_caches_slots() -> None:
    model = models.tiny_model("llama", VOCAB, tier="exact")
    cache = transformers.StaticCache(config=model.config, max_cache_len=12)
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    padded = model.create_masks_for_generate(attention_mask=mask, cache=cache)
    assert padded.shape == (2, 12) and torch.equal(padded[:, :3], mask) and not padded[:, 3:].any()
    assert model.create_masks_for_generate(attention_mask=mask, cache=transformers.DynamicCache()) is mask
