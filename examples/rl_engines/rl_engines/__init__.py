"""An example of a user's RL engines for rlparity's engines workload (docs/architecture.md, "Engines from your
package"): hf.py, a Hugging Face generate() rollout and a teacher-forced trainer of a tiny random Qwen3, patched
with rl_kernel (or stock with engine = { patched = false }); variant.py, the same rollout with a trainer that is
batch-variant (each sequence alone, stock torch), which the gate must fail; trl_grpo.py, TRL's GRPOTrainer (one
step: its generate() rollout and its training forward), patched through rl_kernel.integrations.trl or stock (needs
trl: requirements-trl.txt)."""

__version__ = "0.1.0"
