"""epochal's own checkpoints as ``(ModelConfig, state_dict)``: moved to
:mod:`epochal.train.state.epochal_ckpt` (the trainer's format, read by ``init_from`` and
``epochal embed`` too); re-exported here for the converters and existing imports."""

from epochal.train.state import epochal_ckpt as _impl
from epochal.train.state.epochal_ckpt import *  # noqa: F403
from epochal.train.state.epochal_ckpt import __all__  # noqa: F401


def __getattr__(name: str):  # private helpers too (``_read_json``, ...)
    return getattr(_impl, name)
