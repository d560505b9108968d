"""Megatron-LM checkpoints: legacy (``model_optim_rng.pt``), Megatron-Core torch_dist, NeMo 2,
their arguments and tensor layouts."""
