"""epochal: deterministic multi-epoch Megatron-style data and GPT training on PyTorch.

Two layers that can be used apart:

- :mod:`epochal.data` (and :mod:`epochal.testing`): datasets, samplers and loaders.
- :mod:`epochal.model`, :mod:`epochal.parallel`, :mod:`epochal.train`: the trainer.
"""

__version__ = "0.1.0"
