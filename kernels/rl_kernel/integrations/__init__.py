"""Framework adapters (vLLM, SGLang, Megatron, FSDP, ...) land here: thin layers that route a
framework's log-prob, norm or attention calls to rl_kernel's operators. Empty until the model
issues fill it."""
