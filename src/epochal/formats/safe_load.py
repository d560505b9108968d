"""Load checkpoint files without unpickling arbitrary objects.

- :func:`safe_torch_load`: ``torch.load(weights_only=True)`` with a small,
  explicit allow-list for what Megatron-LM puts next to its tensors:

  * ``argparse.Namespace`` (the ``args`` of every Megatron checkpoint), loaded as
    the real class (its ``__dict__`` is restored; no code runs);
  * NumPy arrays and dtypes (``np.random.get_state()`` in ``rng_state``);
  * objects whose class lives in ``megatron.*``, ``transformer_engine.*`` or
    ``apex.*`` (enums such as ``ModelType``/``AttnBackend`` inside ``args``, TE
    metadata) and ``io.BytesIO`` (Transformer Engine's ``_extra_state``) are
    *not* imported: each becomes an inert :class:`OpaqueObject` that records the
    class name and its constructor/state arguments, so none of their code runs.

  Every member of the zip file is first checked against its CRC-32
  (:func:`verify_zip_members`; ``torch.load`` never checks it, so one changed byte
  would load silently). Every other global is refused with :class:`UnsafeCheckpointError` naming the
  file and the globals, before anything is unpickled
  (``torch.serialization.get_unsafe_globals_in_checkpoint`` scans the pickle
  without executing it).
- :func:`load_safetensors`: a ``.safetensors`` file to a dict of CPU tensors;
  :func:`safetensors_metadata`: its string metadata.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "OpaqueObject",
    "UnsafeCheckpointError",
    "load_safetensors",
    "safe_torch_load",
    "safetensors_metadata",
    "verify_zip_members",
]

_OPAQUE_PREFIXES = ("megatron.", "transformer_engine.", "apex.")
_OPAQUE_NAMES = {"_io.BytesIO"}


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holds objects we refuse to unpickle, or is corrupt; the message names it."""


class OpaqueObject:
    """Inert stand-in for an object of a class we do not import (see the module docstring).

    Attributes:
        qualified_name: ``module.Class`` of the original object (class attribute of
            the per-name subclass).
        args: positional arguments the pickle passed to the constructor (e.g. an
            enum's value).
        state: the state the pickle restored (``__setstate__``), or None.
    """

    qualified_name = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> OpaqueObject:  # noqa: D102
        obj = super().__new__(cls)
        obj.args = args
        obj.state = None
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    @property
    def value(self) -> Any:
        """The single constructor argument (an enum's value), else the arguments tuple."""
        return self.args[0] if len(self.args) == 1 else self.args

    def __repr__(self) -> str:
        return f"<opaque {self.qualified_name}{self.args!r}>"


def _opaque_class(name: str) -> type[OpaqueObject]:
    return type(name.rsplit(".", 1)[-1], (OpaqueObject,), {"qualified_name": name})


def _real_globals() -> dict[str, Any]:
    import argparse

    real: dict[str, Any] = {"argparse.Namespace": argparse.Namespace}
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return real
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    real["numpy.core.multiarray._reconstruct"] = _reconstruct
    real["numpy._core.multiarray._reconstruct"] = _reconstruct
    real["numpy.ndarray"] = np.ndarray
    real["numpy.dtype"] = np.dtype
    for attr in dir(getattr(np, "dtypes", object())):
        cls = getattr(np.dtypes, attr, None)
        if isinstance(cls, type) and issubclass(cls, np.dtype):
            real[f"numpy.dtypes.{attr}"] = cls
    return real


def safe_torch_load(path: str | os.PathLike, *, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(path, weights_only=True)`` admitting only the allow-list above.

    Args:
        path: a file written by ``torch.save`` (zip format).
        map_location: where to put the tensors (CPU by default).

    Returns:
        The unpickled object (dicts, lists, tensors, ``argparse.Namespace``,
        NumPy arrays, :class:`OpaqueObject` stand-ins).

    Raises:
        FileNotFoundError: the file does not exist.
        UnsafeCheckpointError: the file holds a global outside the allow-list, is
            not a readable torch checkpoint, or a member fails its CRC (a changed byte).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    verify_zip_members(path)
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception as exc:  # noqa: BLE001 - any failure here means a bad file
        raise UnsafeCheckpointError(
            f"{path}: not a readable torch checkpoint ({type(exc).__name__}: {exc})"
        ) from exc
    real = _real_globals()
    allowed: list[tuple[Any, str]] = []
    refused: list[str] = []
    for name in names:
        if name in real:
            allowed.append((real[name], name))
        elif name in _OPAQUE_NAMES or name.startswith(_OPAQUE_PREFIXES):
            allowed.append((_opaque_class(name), name))
        else:
            refused.append(name)
    if "numpy.dtype" in names:  # BUILD on a dtype instance checks its concrete class
        allowed += [(cls, name) for name, cls in real.items() if name.startswith("numpy.dtypes.")]
    if refused:
        raise UnsafeCheckpointError(
            f"{path}: refusing to unpickle {', '.join(sorted(refused))} "
            "(only tensors, argparse.Namespace, NumPy arrays and inert Megatron objects are allowed)"
        )
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        raise UnsafeCheckpointError(f"{path}: unsafe or corrupt checkpoint ({exc})") from exc


def verify_zip_members(path: Path) -> None:
    """Check every member of a ``torch.save`` zip file against its recorded CRC-32.

    ``torch.save`` stores its members uncompressed with their CRC, which ``torch.load``
    never checks: one changed byte in a weight would load silently. Files in the
    pre-zip format (torch < 1.6) carry no checksum and are not checked.

    Raises:
        UnsafeCheckpointError: a member whose bytes do not match its CRC, or a damaged
            zip directory, naming the file and the member.
    """
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise UnsafeCheckpointError(f"{path}: damaged checkpoint file ({exc})") from exc
    if bad is not None:
        raise UnsafeCheckpointError(
            f"{path}: damaged checkpoint file: member {bad!r} fails its CRC-32 check "
            "(the file changed after it was written)"
        )


def load_safetensors(path: str | os.PathLike, *, verify: bool = True) -> dict[str, torch.Tensor]:
    """Read every tensor of a ``.safetensors`` file onto the CPU.

    With ``verify``, a file that records its checksum (epochal's exports) is
    verified first; other files (Hugging Face's, ...) have none and are read as
    they are.

    Raises:
        FileNotFoundError: the file does not exist.
        UnsafeCheckpointError: the file is not a valid safetensors file.
        epochal._checksum.ChecksumError: the file fails its recorded checksum.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from epochal._checksum import verify_safetensors

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such safetensors file")
    if verify:
        verify_safetensors(path)
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise UnsafeCheckpointError(f"{path}: not a valid safetensors file ({exc})") from exc


def safetensors_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The ``__metadata__`` strings of a ``.safetensors`` file (empty if it has none).

    Raises:
        FileNotFoundError: the file does not exist.
        UnsafeCheckpointError: the file is not a valid safetensors file.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such safetensors file")
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as exc:
        raise UnsafeCheckpointError(f"{path}: not a valid safetensors file ({exc})") from exc
