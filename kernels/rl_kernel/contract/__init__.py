"""What proves the numerical contract (docs/numerics.md) of every tier: the walk over a tier's operator families and
their cases (families), their golden digests (golden: `python -m rl_kernel.contract.golden`), the device self-check
(selfcheck: `python -m rl_kernel.contract.selfcheck`) and the contract-mutation build (mutations). Entry points that
sit above the tiers they check: nothing in the tiers imports them."""
