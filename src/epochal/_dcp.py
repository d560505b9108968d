"""PyTorch DCP (``torch.distributed.checkpoint``) in one process, without PyTorch's notice.

``dcp.save`` and ``dcp.load`` warn ``torch.distributed is disabled, unavailable or
uninitialized, assuming the intent is to save (load) in a single process`` whenever
they run without a process group, and also when the caller asks for exactly that
with ``no_dist=True`` (torch 2.13, ``state_dict_saver.py`` / ``state_dict_loader.py``:
the warning is issued before ``no_dist`` is looked at). epochal saves and reads DCP
folders in one process on purpose (a one-process run, ``epochal convert``'s
``torch_dist`` export and import, consolidating a checkpoint), so the notice says
nothing to its users; :func:`single_process_dcp` ignores that one warning, by its
text, category and module, and nothing else.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

__all__ = ["single_process_dcp"]

_NOTICE = (
    r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent is "
    r"to (save|load) in a single process"
)


@contextlib.contextmanager
def single_process_dcp() -> Iterator[None]:
    """A context in which DCP's one-process notice is not shown (other warnings are)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=_NOTICE, category=UserWarning, module=r"torch\.distributed"
        )
        yield
