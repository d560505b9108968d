"""Hugging Face Accelerate's API on epochal: an Accelerate + Megatron-LM script with its imports changed.

``from accelerate import Accelerator, DistributedType, init_empty_weights`` becomes
``from epochal.accelerate import ...``, ``from accelerate.utils import
MegatronLMDummyScheduler, set_seed`` becomes ``from epochal.accelerate.utils import ...``,
``from accelerate.logging import get_logger`` becomes ``from epochal.accelerate.logging
import get_logger``; ``accelerate launch --config_file cfg.yaml script.py`` becomes
``epochal launch --config_file cfg.yaml script.py``. ``accelerator.prepare`` turns the
transformers model into epochal's (same weights, parallelised as configured), the
optimizer's settings into epochal's optimizer, the loaders into Megatron samplers
with ``consumed_samples`` as their state; ``save_state`` / ``load_state`` resume
exactly. See ``docs/coming-from/accelerate.md``.
"""

from epochal._lazy import lazy_exports

_EXPORTS = {
    "Accelerator": "accelerator",
    "AcceleratorError": "accelerator",
    "DistributedType": "state",
    "AcceleratorState": "state",
    "DataLoaderConfiguration": "configuration",
    "init_empty_weights": "seeding",
    "set_seed": "seeding",
    "MegatronLMPlugin": "plugin",
    "MegatronLMDummyScheduler": "plugin",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
