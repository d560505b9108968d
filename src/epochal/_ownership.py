"""Who owns a path: the one question every epochal writer asks before it writes.

A folder or file that one writer made belongs to it; another writer may not delete,
replace or write into it. The writers and what marks their outputs (read from the
disk, so outputs of earlier releases are recognised too):

==========================  ==================================================================
``epochal train``           a run directory: ``metrics.jsonl``, ``.epochal-lock`` or a
                            ``checkpoints/`` folder of checkpoints
checkpoints folder          ``latest`` or ``step_*/trainer_state.json``: a run's
                            ``checkpoints/``, or ``accelerator.save_state``'s folder
one checkpoint              ``trainer_state.json`` (a ``step_*`` folder)
``epochal convert``         a Hugging Face folder (``config.json`` and weights), a Megatron
                            folder (``latest_checkpointed_iteration.txt``), a model-only run
                            directory, a ``.safetensors`` file with ``epochal_model_config``
``epochal embed``           a ``.safetensors`` file with ``ids`` metadata, a ``.parquet`` file
``epochal preprocess``      ``PREFIX.bin`` + ``PREFIX.idx`` with ``PREFIX.tokenizer.json``
``epochal merge``           ``PREFIX.bin`` + ``PREFIX.idx`` without a tokenizer record
``epochal config``          a file whose first line is :data:`CONFIG_MARKER`
==========================  ==================================================================

The rule (:func:`check_writable`): a writer may write a path only if no owned folder
lies at or above it, except its own kind of folder at the path itself (``epochal
train`` resuming its run directory, ``save_state`` replacing its own checkpoint,
``epochal convert --overwrite`` replacing its own output); an existing file may be
replaced only by the writer that made it. Refusals raise :class:`OwnedPathError`
naming the path, its owner and what to do, before anything is written.

Markers are read, not written (apart from ``epochal config``'s first line), so a
Hugging Face model folder another tool wrote counts as a converted model, and a
``.bin``/``.idx`` pair Megatron-LM wrote (no tokenizer record) as ``epochal merge``'s.
Folders below a path are looked for only by ``epochal train`` (a run directory may not
contain another run), three levels deep. The library functions (``preprocess()``,
``merge_indexed_datasets``, ``Checkpointer``) do not ask; the commands, ``save_state``
and ``Trainer.train`` do.

This module imports nothing from epochal (every layer uses it).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CHECKPOINT",
    "CHECKPOINTS",
    "CONFIG_MARKER",
    "CONVERTED",
    "CONVERTED_RUN",
    "RUN",
    "STATE",
    "Owner",
    "OwnedPathError",
    "check_writable",
    "file_writer",
    "folder_owner",
    "owned_inside",
    "owner_above",
]

#: The first line of every file ``epochal config`` writes (TOML and YAML comments alike).
CONFIG_MARKER = "# Written by epochal config; rerunning it may replace this file."

RUN = "run"
CHECKPOINTS = "checkpoints"
CHECKPOINT = "checkpoint"
CONVERTED = "converted"  # a Hugging Face or Megatron folder epochal convert wrote
CONVERTED_RUN = "converted_run"  # a model-only run directory epochal convert wrote
STATE = "save_state"  # a checkpoints folder of accelerator.save_state (no run above it)

_WHAT = {
    RUN: "the run directory of an epochal train run",
    CHECKPOINTS: "the checkpoints folder of an epochal train run",
    STATE: "a checkpoint folder of accelerator.save_state",
    CHECKPOINT: "a checkpoint",
    CONVERTED: "a Hugging Face or Megatron model folder, as epochal convert writes them",
    CONVERTED_RUN: "a model-only run directory written by epochal convert",
}


class OwnedPathError(ValueError):
    """A writer was pointed at a path another run or command owns."""


@dataclass(frozen=True)
class Owner:
    """An owned folder: its ``kind`` (one of the module's kind constants) and ``root``."""

    kind: str
    root: Path
    #: the run directory ``root`` lies in, if it is not one itself
    run: Path | None = None

    def what(self) -> str:
        """What it is, in words (and whose)."""
        text = _WHAT[self.kind]
        if self.run is not None and self.kind != CHECKPOINTS:
            text += f" of the epochal train run {self.run}"
        return text

    def describe(self) -> str:
        """``"<root> (<what it is>)"``."""
        return f"{self.root} ({self.what()})"


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


def _is_dir(path: Path, links: bool = True) -> bool:
    try:
        return path.is_dir() and (links or not path.is_symlink())
    except OSError:
        return False


def _checkpoint_store(folder: Path) -> bool:
    if _is_file(folder / "latest"):
        return True
    try:
        return any(
            p.name.startswith("step_") and _is_file(p / "trainer_state.json")
            for p in folder.iterdir()
        )
    except OSError:
        return False


def _model_only(store: Path) -> bool:
    """Whether every checkpoint of ``store`` is model-only (a converted model, no training)."""
    try:
        steps = [p for p in store.iterdir() if p.name.startswith("step_")]
        states = [json.loads((p / "trainer_state.json").read_text("utf-8")) for p in steps]
    except (OSError, ValueError):
        return False
    return bool(states) and all(isinstance(s, dict) and s.get("model_only") for s in states)


def _is_run(folder: Path) -> bool:
    return (
        _is_file(folder / "metrics.jsonl")
        or (folder / ".epochal-lock").exists()
        or (_is_dir(folder / "checkpoints") and _checkpoint_store(folder / "checkpoints"))
    )


def folder_owner(folder: str | os.PathLike) -> Owner | None:
    """What the existing folder ``folder`` itself is (None: no writer's folder, or not a folder)."""
    folder = Path(folder)
    if not _is_dir(folder):
        return None
    if _is_run(folder):
        converted = not _is_file(folder / "metrics.jsonl") and _model_only(folder / "checkpoints")
        return Owner(CONVERTED_RUN if converted else RUN, folder)
    if _is_file(folder / "trainer_state.json"):
        return Owner(CHECKPOINT, folder)
    if _checkpoint_store(folder):
        if folder.name == "checkpoints" and _is_run(folder.parent):
            return Owner(CHECKPOINTS, folder)
        return Owner(STATE, folder)
    if _is_file(folder / "latest_checkpointed_iteration.txt"):
        return Owner(CONVERTED, folder)
    if _is_file(folder / "config.json") and (
        any(folder.glob("*.safetensors")) or _is_file(folder / "pytorch_model.bin")
    ):
        return Owner(CONVERTED, folder)
    return None


def owner_above(path: str | os.PathLike) -> Owner | None:
    """The nearest owned folder at or above ``path`` (links followed; ``path`` need not exist)."""
    here = Path(path).resolve()
    found = None
    for folder in (here, *here.parents):
        owner = folder_owner(folder)
        if owner is None:
            continue
        if found is None:
            found = owner
            if owner.kind == RUN:
                break
        elif owner.kind == RUN:
            return Owner(found.kind, found.root, run=owner.root)
    return found


def owned_inside(
    folder: str | os.PathLike, *, depth: int = 3, skip: frozenset[str] = frozenset()
) -> Owner | None:
    """An owned folder strictly inside ``folder`` (up to ``depth`` levels, links not followed).

    ``skip``: names of ``folder``'s own entries not to look into (a run's ``checkpoints``).
    At most a few thousand folders are looked at.
    """
    pending = [(Path(folder), 0)]
    seen = 0
    while pending and seen < 4000:
        here, level = pending.pop()
        try:
            entries = sorted(p for p in here.iterdir() if _is_dir(p, links=False))
        except OSError:
            continue
        for sub in entries:
            if level == 0 and sub.name in skip:
                continue
            seen += 1
            owner = folder_owner(sub)
            if owner is not None:
                return owner
            if level + 1 < depth:
                pending.append((sub, level + 1))
    return None


def _safetensors_metadata(path: Path) -> dict[str, str]:
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(min(size, 1 << 24)))
        meta = header.get("__metadata__") or {}
        return meta if isinstance(meta, dict) else {}
    except (OSError, ValueError, struct.error):
        return {}


def file_writer(path: str | os.PathLike) -> str | None:
    """Which epochal writer made the existing file ``path`` (``"config"``, ``"embed"``,
    ``"convert"``, ``"preprocess"``, ``"merge"``), or None (not recognised / absent)."""
    path = Path(path)
    if not _is_file(path):
        return None
    if path.name.endswith(".tokenizer.json"):
        stem = str(path).removesuffix(".tokenizer.json")
        both = _is_file(Path(stem + ".bin")) and _is_file(Path(stem + ".idx"))
        return "preprocess" if both else None
    if path.suffix in (".bin", ".idx"):
        stem = str(path)[: -len(path.suffix)]
        if not (_is_file(Path(stem + ".bin")) and _is_file(Path(stem + ".idx"))):
            return None
        return "preprocess" if _is_file(Path(stem + ".tokenizer.json")) else "merge"
    if path.suffix == ".safetensors":
        meta = _safetensors_metadata(path)
        if "epochal_model_config" in meta:
            return "convert"
        return "embed" if "ids" in meta else None
    if path.suffix == ".parquet":
        return "embed"
    try:
        with path.open("rb") as f:
            first = f.read(len(CONFIG_MARKER.encode()))
    except OSError:
        return None
    return "config" if first == CONFIG_MARKER.encode() else None


def _writer(name: str) -> str:
    return "accelerator.save_state" if name == "save_state" else f"epochal {name}"


def check_writable(
    path: str | os.PathLike,
    *,
    writer: str,
    option: str,
    own: frozenset[str] = frozenset(),
    replace_files: bool = True,
) -> None:
    """Refuse, before anything is written, a ``path`` that another run or command owns.

    Args:
        path: the folder or file ``writer`` is about to write (need not exist).
        writer: who writes (``"train"``, ``"save_state"``, ``"convert"``, ``"embed"``,
            ``"merge"``, ``"preprocess"``, ``"config"``), for the message and to
            recognise its own files.
        option: how the user named ``path`` (``"--run_dir"``, ``"--output"``, ...).
        own: the folder kinds ``writer`` may write when they are ``path`` itself
            (a folder above ``path`` is never writable).
        replace_files: an existing file ``writer`` made may be replaced (False: none).

    Raises:
        OwnedPathError: naming ``path``, what owns it and how to go on.
    """
    target = Path(path)
    here = target.resolve()
    found = owner_above(here)
    if found is not None and not (found.root == here and found.kind in own):
        where = f"is {found.what()}" if found.root == here else f"lies inside {found.describe()}"
        raise OwnedPathError(
            f"{option} {path} {where}; {_writer(writer)} does not write into what another "
            "run or command wrote: choose a path outside it"
        )
    made_by = file_writer(target)
    if made_by is not None and not (replace_files and made_by == writer):
        who = (
            "a .bin/.idx pair without a tokenizer record (epochal merge's output, or another "
            "tool's)"
            if made_by == "merge"
            else f"a file {_writer(made_by)} wrote"
        )
        raise OwnedPathError(
            f"{option} {path} is {who}; {_writer(writer)} does not replace it: choose another "
            "path (or delete that file first)"
        )
