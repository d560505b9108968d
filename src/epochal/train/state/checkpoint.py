"""Checkpoints: DCP folders per step, written then renamed, a ``latest`` pointer, keep-last-k.

Layout of ``<dir>`` (``<run_dir>/checkpoints``)::

    step_0000200/            one complete checkpoint (never partially written)
        .metadata            DCP metadata
        __0_0.distcp ...     DCP tensor data (model, optimizer)
        rng_rank0.pt         every RNG state of rank 0 (a dict of tensors)
        trainer_state.json   step, consumed samples, scheduler, data state, ...
        config.toml          the resolved configuration of the run
        manifest.json        size and SHA-256 of every file above (written last)
    latest                   text file naming the newest complete folder
    .tmp-step_0000300.<host>.<pid>.<random>/   a save in progress

Saving writes everything into ``.tmp-step_N.<host>.<pid>.<random>`` (named by
rank 0 of the saving job, so two jobs never share one; the next save removes
those of dead processes on this host and unnamed ones), renames it to ``step_N`` and then
replaces ``latest`` (write-then-rename), so a crash at any moment leaves the
previous checkpoint loadable. Older ``step_*`` folders beyond ``keep_last`` are
deleted afterwards.

Checksums: rank 0 writes ``manifest.json`` (:mod:`epochal._checksum`: size and
SHA-256 of every file, every rank's ``.distcp`` and RNG file included) last,
atomically, before the rename; under a process group each rank hashes a slice
of the files and rank 0 merges them. Loading verifies the folder first and
raises :class:`CheckpointCorruptError` naming the missing, truncated or changed
file; ranks again share the work and every rank gets the same verdict, so all
raise or load together, and all resume from the same step. :meth:`Checkpointer.newest_intact` (``resume =
"auto"``) skips damaged steps, newest first, with a warning naming each, and
deletes nothing: a damaged folder is kept, and when training later re-saves
that step it is moved aside to ``damaged-step_N`` rather than replaced. A folder
without a manifest (written before checksums) loads with a warning, unverified.

Tensors go through ``torch.distributed.checkpoint`` (DCP), with FQN-keyed model
and (flattened) optimizer state from ``torch.distributed.checkpoint.state_dict``,
so the same code saves sharded, reshardable checkpoints under a process group.
It also works in one process without one.

Loading never unpickles arbitrary objects: DCP's ``.metadata`` pickle is read by
:class:`SafeFileSystemReader` with an unpickler that only admits DCP's metadata
classes and the few torch/builtin types they contain; DCP byte items are read by
:class:`SafeLoadPlanner` with ``torch.load(weights_only=True)``; RNG files with
``weights_only=True``; everything else is JSON.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from epochal._atomic import aside_directory, atomic_write, fsync_dir, replace_directory
from epochal._checksum import (
    MANIFEST,
    ChecksumError,
    file_entries,
    list_files,
    manifest_bytes,
    verify_manifest,
)
from epochal._dcp import single_process_dcp
from epochal.train.state.dcp_checks import check_dcp_metadata, dcp_failure, read_per_file
from epochal.train.state.errors import CheckpointCorruptError, CheckpointError
from epochal.train.state.run_lock import stale_temporary, temporary_token
from epochal.train.state.trainer_state import check_trainer_state

__all__ = [
    "CheckpointCorruptError",
    "CheckpointError",
    "Checkpointer",
    "SafeFileSystemReader",
    "SafeLoadPlanner",
    "load_metadata_safely",
    "verify_checkpoint",
]

_STEP_RE = re.compile(r"^step_(\d+)$")
LATEST = "latest"
TRAINER_STATE = "trainer_state.json"

_ALLOWED_GLOBALS: dict[str, set[str]] = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    # Megatron-Core's torch_dist metadata also records the save plans (plain dataclasses)
    "torch.distributed.checkpoint.planner": {
        "SavePlan",
        "WriteItem",
        "WriteItemType",
        "TensorWriteData",
    },
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "slice"},
}


def verify_checkpoint(folder: str | os.PathLike) -> bool:
    """Check every file of checkpoint ``folder`` against its ``manifest.json``.

    Returns:
        True when verified; False (after a ``UserWarning``) for a folder without a
        manifest, written before checksums existed, which loads unverified.

    Raises:
        CheckpointCorruptError: naming the missing, truncated or changed file, or a
            malformed manifest.
        CheckpointError: ``folder`` is not a folder.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: checkpoint folder does not exist")
    try:
        verified = verify_manifest(folder)
    except ChecksumError as exc:
        raise CheckpointCorruptError(str(exc)) from exc
    except OSError as exc:
        raise CheckpointCorruptError(f"{folder}: unreadable ({exc})") from exc
    if not verified:
        _warn_unverified(folder)
    return verified


def _warn_unverified(folder: Path) -> None:
    warnings.warn(
        f"{folder} has no {MANIFEST} (saved before checkpoints carried checksums); "
        "loading it unverified",
        stacklevel=3,
    )


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler admitting only the globals DCP metadata needs."""

    def __init__(self, file: Any, source: str) -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointError(
            f"{self.source}: refusing to unpickle {module}.{name} (not a DCP metadata type)"
        )


def load_metadata_safely(data: bytes | Any, source: str = "<metadata>") -> Metadata:
    """Unpickle DCP ``Metadata`` from bytes or a binary file, admitting only its own types.

    Raises:
        CheckpointError: a disallowed global, a corrupt pickle, or not a ``Metadata``.
    """
    stream = io.BytesIO(data) if isinstance(data, bytes | bytearray) else data
    try:
        metadata = _RestrictedUnpickler(stream, source).load()
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a bad file
        raise CheckpointError(
            f"{source}: corrupt DCP metadata ({type(exc).__name__}: {exc})"
        ) from exc
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{source}: expected DCP Metadata, got {type(metadata).__name__}")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``read_metadata`` uses a restricted unpickler and checks what
    the metadata declares against the files (:func:`~epochal.train.state.dcp_checks.check_dcp_metadata`)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        try:
            with self.fs.create_stream(path, "rb") as f:
                metadata = load_metadata_safely(f, str(path))
        except FileNotFoundError as exc:
            raise CheckpointError(f"{path}: DCP metadata file is missing") from exc
        check_dcp_metadata(metadata, Path(self.path), str(path))  # before anything is allocated
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: Any, planner: Any) -> Any:
        """DCP's ``read_data`` one file at a time; a damaged file's error names it."""
        read = super().read_data
        return read_per_file(plan, self.storage_data, Path(self.path), lambda p: read(p, planner))


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that loads non-tensor items with ``weights_only=True``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise CheckpointError(
                f"unsafe or corrupt item {read_item.dest_index.fqn!r}: {exc}"
            ) from exc
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def step_folder_name(step: int) -> str:
    """``step_0000042`` for step 42."""
    return f"step_{step:07d}"


class Checkpointer:
    """Save and find checkpoints under one directory.

    Args:
        directory: the checkpoints folder (created if needed).
        keep_last: number of newest ``step_*`` folders to keep (>= 1).
        rank: this process's global rank (rank 0 writes the files outside DCP).
        barrier: called between phases when several processes save together
            (``torch.distributed.barrier``); ``None`` in one process.
        world_size: the number of processes saving and loading together.
        all_gather: ``all_gather(obj)`` returns every rank's ``obj``, by rank (a
            collective, ``torch.distributed.all_gather_object``): the ranks then
            share hashing on save and verifying on load, and all act on the same
            verdict. ``None``: rank 0 hashes every file on save and each process
            verifies every file itself on load.
        checksums: write ``manifest.json`` on save and verify it on load (default);
            False skips both (``benchmarks/bench_checkpoint.py`` measures the cost).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        keep_last: int = 2,
        rank: int = 0,
        barrier: Callable[[], None] | None = None,
        world_size: int = 1,
        all_gather: Callable[[Any], list[Any]] | None = None,
        checksums: bool = True,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"checkpoint.keep_last must be >= 1, got {keep_last}")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.rank = rank
        self._barrier = barrier or (lambda: None)
        self.world_size = world_size
        self._all_gather = all_gather
        self.checksums = checksums
        self._verified: set[Path] = set()
        self._token: str | None = None
        #: step folders found damaged by :meth:`newest_intact` (kept; see :meth:`save`)
        self.damaged: set[Path] = set()

    # ------------------------------------------------------------------ finding
    def step_folders(self) -> list[tuple[int, Path]]:
        """Complete checkpoint folders as ``(step, path)``, oldest first."""
        if not self.directory.is_dir():
            return []
        found = []
        for child in self.directory.iterdir():
            m = _STEP_RE.match(child.name)
            if m and child.is_dir():
                found.append((int(m.group(1)), child))
        return sorted(found)

    def latest(self) -> Path | None:
        """The folder ``latest`` names (or the newest ``step_*`` if the pointer is missing); None if none."""
        pointer = self.directory / LATEST
        if pointer.is_file():
            name = pointer.read_text().strip()
            folder = self.directory / name
            if _STEP_RE.match(name) and not folder.is_dir() and aside_directory(folder).is_dir():
                # a crash while re-saving this step, between replace_directory's two
                # renames: the previous complete checkpoint waits under the aside name
                warnings.warn(
                    f"{folder} is missing (a save of that step was interrupted); "
                    f"using its previous copy {aside_directory(folder)}",
                    stacklevel=2,
                )
                return aside_directory(folder)
            if not _STEP_RE.match(name) or not folder.is_dir():
                raise CheckpointError(
                    f"{pointer}: names {name!r}, which is not a checkpoint folder"
                )
            return folder
        folders = self.step_folders()
        return folders[-1][1] if folders else None

    # ----------------------------------------------------------------- checking
    def _verify(self, folder: Path) -> None:
        """:func:`verify_checkpoint` shared by the ranks: each checks a slice, all get the verdict.

        Without ``all_gather`` this process checks every file itself.

        Raises:
            CheckpointCorruptError: on every rank alike, naming the first damaged file.
            CheckpointError: the folder does not exist.
        """
        if self._all_gather is None:
            verify_checkpoint(folder)
            return
        if not folder.is_dir():
            raise CheckpointError(f"{folder}: checkpoint folder does not exist")
        problem: str | None = None
        verified = False
        try:
            verified = verify_manifest(folder, part=(self.rank, self.world_size))
        except ChecksumError as exc:
            problem = str(exc)
        except OSError as exc:
            problem = f"{folder}: unreadable ({exc})"
        problems = [p for p in self._all_gather(problem) if p is not None]
        if problems:
            raise CheckpointCorruptError(problems[0])
        if not verified and self.rank == 0:
            _warn_unverified(folder)

    def check_intact(self, folder: str | os.PathLike) -> None:
        """Verify ``folder``'s checksums once (a collective when ranks share the work).

        Raises:
            CheckpointCorruptError: naming the damaged or missing file (on every rank).
        """
        folder = Path(folder)
        if not self.checksums or folder.resolve() in self._verified:
            return
        self._verify(folder)
        self._verified.add(folder.resolve())

    def newest_intact(self) -> Path | None:
        """The newest checkpoint that passes its checksums: ``latest()``, else older steps.

        Each damaged step skipped gets a ``UserWarning`` (rank 0) naming its damaged
        file and is remembered in :attr:`damaged`; nothing is deleted. Every rank
        calls this together and gets the same folder (the verdicts are shared).

        Returns:
            The folder (verified, or without a manifest), or None when there is no
            checkpoint at all.

        Raises:
            CheckpointCorruptError: checkpoints exist but every one is damaged.
        """
        latest = self.latest()
        if latest is None or not self.checksums:
            return latest
        m = _STEP_RE.match(latest.name.removeprefix(".old-"))
        newest = int(m.group(1)) if m else -1
        candidates = [latest] + [p for step, p in reversed(self.step_folders()) if step < newest]
        problems: list[str] = []
        for folder in candidates:
            try:
                self.check_intact(folder)
            except CheckpointCorruptError as exc:
                self.damaged.add(folder)
                problems.append(str(exc))
                continue
            if self.rank == 0:
                for problem in problems:
                    warnings.warn(
                        f"checkpoint skipped as damaged: {problem}; resuming from {folder} "
                        "(nothing was deleted)",
                        stacklevel=2,
                    )
            return folder
        raise CheckpointCorruptError(
            f"{self.directory}: every checkpoint is damaged: " + "; ".join(problems)
        )

    # ------------------------------------------------------------------- saving
    def save(
        self,
        step: int,
        state: dict[str, Any],
        *,
        trainer_state: dict[str, Any],
        rng_state: dict[str, torch.Tensor],
        config_toml: str | None = None,
    ) -> Path:
        """Write checkpoint ``step`` and make it the latest.

        Args:
            step: the optimizer step just completed.
            state: DCP state: tensors, dicts of tensors, or ``Stateful`` objects
                (``state_dict()`` / ``load_state_dict()``), e.g. model and optimizer.
            trainer_state: JSON-serializable bookkeeping (step, consumed samples, ...).
            rng_state: this rank's RNG tensors (:func:`epochal.train.state.rng.get_rng_state`).
            config_toml: the resolved configuration, stored as ``config.toml``.

        Returns:
            The final folder.
        """
        final = self.directory / step_folder_name(step)
        tmp = self.directory / f".tmp-{final.name}.{self._job_token()}"
        # Without all_gather the ranks' tokens differ: rank 0 names the folder in a file.
        pending = self.directory / f".pending-{final.name}"
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            for stale in self.directory.glob(".tmp-step_*"):
                if stale_temporary(stale.name):
                    shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir()
            if self._all_gather is None:
                atomic_write(pending, tmp.name)
        self._barrier()
        if self._all_gather is None and self.rank != 0:
            tmp = self.directory / pending.read_text().strip()
        with single_process_dcp():
            dcp.save(state, storage_writer=FileSystemWriter(tmp, thread_count=1))
        atomic_write(tmp / f"rng_rank{self.rank}.pt", _torch_bytes(rng_state))
        if self.rank == 0:
            atomic_write(tmp / TRAINER_STATE, json.dumps(trainer_state, indent=1))
            if config_toml is not None:
                atomic_write(tmp / "config.toml", config_toml)
        self._barrier()
        if self.checksums:
            files = self._hash_files(tmp)
            if self.rank == 0:  # last: it covers the rest
                atomic_write(tmp / MANIFEST, manifest_bytes(files))
        if self.rank == 0:
            fsync_dir(tmp)
            if final in self.damaged and final.is_dir():  # kept for inspection, never deleted
                os.replace(final, _free_name(final.with_name(f"damaged-{final.name}")))
                self.damaged.discard(final)
            # (re-saving a step, e.g. after resuming from an older checkpoint, swaps it)
            replace_directory(tmp, final)
            self._verified.discard(final.resolve())
            atomic_write(self.directory / LATEST, f"{final.name}\n")
            self._prune(keep=final)
        self._barrier()
        if self.rank == 0 and self._all_gather is None:
            pending.unlink(missing_ok=True)  # read by the other ranks before the last barrier
        return final

    def _job_token(self) -> str:
        """``<host>.<pid>.<random>`` of rank 0, the same on every rank of this job (a collective once)."""
        if self._token is None:
            self._token = temporary_token()
            if self._all_gather is not None:
                self._token = self._all_gather(self._token)[0]
        return self._token

    def _hash_files(self, tmp: Path) -> dict[str, dict[str, Any]]:
        """The manifest entries of every file in ``tmp`` (on rank 0; each rank hashes a slice).

        Called by every rank after all have written their files.
        """
        names = list_files(tmp)
        if self._all_gather is None:
            return file_entries(tmp, names) if self.rank == 0 else {}
        parts = self._all_gather(file_entries(tmp, names[self.rank :: self.world_size]))
        return {name: entry for part in parts for name, entry in part.items()}

    def _prune(self, keep: Path) -> None:
        folders = [(s, p) for s, p in self.step_folders() if p not in self.damaged]
        for _, path in folders[: max(0, len(folders) - self.keep_last)]:
            if path != keep:
                shutil.rmtree(path, ignore_errors=True)
        # previous copies an interrupted re-save left behind (``latest`` names ``keep`` now)
        for stale in self.directory.glob(".old-step_*"):
            shutil.rmtree(stale, ignore_errors=True)

    # ------------------------------------------------------------------ loading
    def load(
        self, folder: str | os.PathLike, state: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Load checkpoint ``folder`` into ``state`` in place (DCP semantics).

        The folder's checksums are verified first (:meth:`check_intact`).

        Returns:
            ``(trainer_state, rng_state)``: the JSON bookkeeping and this rank's RNG tensors.

        Raises:
            CheckpointCorruptError: a file is missing, truncated or changed since the save.
            CheckpointError: the folder or one of its files is missing, malformed or unsafe.
        """
        folder = Path(folder)
        trainer_state = self.read_trainer_state(folder)
        self.load_tensors(folder, state)
        rng_path = folder / f"rng_rank{self.rank}.pt"
        if not rng_path.is_file():
            rng_path = folder / "rng_rank0.pt"
        try:
            rng_state = torch.load(rng_path, map_location="cpu", weights_only=True)
        except FileNotFoundError as exc:
            raise CheckpointError(f"{rng_path}: missing RNG state") from exc
        except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, ValueError) as exc:
            # a truncated file: "[Errno 22] Invalid argument" (OSError) or EOFError
            raise CheckpointError(f"{rng_path}: unsafe or corrupt RNG state ({exc})") from exc
        if not isinstance(rng_state, dict) or not all(
            isinstance(v, torch.Tensor) for v in rng_state.values()
        ):
            raise CheckpointError(f"{rng_path}: expected a dict of tensors")
        return trainer_state, rng_state

    def read_trainer_state(self, folder: str | os.PathLike) -> dict[str, Any]:
        """The JSON bookkeeping of checkpoint ``folder``, after :meth:`check_intact`.

        Raises:
            CheckpointCorruptError: a file of the folder is damaged or missing.
            CheckpointError: the folder or its ``trainer_state.json`` is missing or malformed.
        """
        folder = Path(folder)
        json_path = folder / TRAINER_STATE
        if not folder.is_dir():
            raise CheckpointError(f"{folder}: checkpoint folder does not exist")
        self.check_intact(folder)
        try:
            trainer_state = json.loads(json_path.read_text())
        except FileNotFoundError as exc:
            raise CheckpointError(f"{json_path}: missing (incomplete checkpoint?)") from exc
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{json_path}: not valid JSON ({exc})") from exc
        if not isinstance(trainer_state, dict):
            raise CheckpointError(f"{json_path}: expected a JSON object")
        return check_trainer_state(trainer_state, str(json_path))

    def load_tensors(self, folder: str | os.PathLike, state: dict[str, Any]) -> None:
        """Load the DCP tensors of checkpoint ``folder`` into ``state`` in place, after :meth:`check_intact`.

        ``state`` may name a subset of what was saved (e.g. only ``"model"``, to
        initialize a fresh run from a checkpoint's weights).

        Raises:
            CheckpointCorruptError: a file of the folder is damaged or missing.
            CheckpointError: the metadata is missing or unsafe, or the tensors do not
                fit ``state`` (another model shape).
        """
        folder = Path(folder)
        if folder.is_dir():
            self.check_intact(folder)
        meta_path = folder / ".metadata"
        if not meta_path.is_file():
            raise CheckpointError(
                f"{meta_path}: DCP metadata file is missing (incomplete checkpoint?)"
            )
        with open(meta_path, "rb") as f:
            load_metadata_safely(f, str(meta_path))  # refuse unsafe metadata before DCP reads it
        try:
            with single_process_dcp():
                dcp.load(
                    state, storage_reader=SafeFileSystemReader(folder), planner=SafeLoadPlanner()
                )
        except CheckpointError:
            raise
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP's error is a BaseException
            if isinstance(cause := dcp_failure(exc), CheckpointError):
                raise cause from exc  # a damaged or truncated file, named
            raise CheckpointError(
                f"{folder}: cannot load into this model/optimizer: {exc}"
            ) from exc


def _free_name(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``, ... : the first name not taken."""
    candidate, n = path, 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def _torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
