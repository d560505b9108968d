"""Seeded fuzzing of every checkpoint format's reader: a clear error or a result, nothing else.

A few hundred mutations of tiny checkpoints (:mod:`tests.convert.hostile`): configuration
fields set to hostile values (wrong types, zero, negative, fractional, huge, NaN, nested
containers) or removed, DCP metadata with moved, resized or escaping chunks, shard files
truncated or with flipped bytes, YAML text damaged. Every load must either succeed or raise
a ``ValueError`` / ``OSError`` (the CLI's "clear error" classes, which name the file); a
raw ``TypeError`` / ``KeyError`` / ``RuntimeError``, a load that runs longer than
:data:`PER_LOAD_S` seconds, or a peak memory growth over :data:`RSS_BOUND_MB` fails the test
with the mutation that caused it.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import signal
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from epochal.convert.megatron.legacy import load_megatron_checkpoint
from epochal.formats.hf.io import load_hf_checkpoint
from epochal.train.state.epochal_ckpt import load_epochal_checkpoint
from tests.convert import hostile

PER_LOAD_S = 10
RSS_BOUND_MB = 1024
HOSTILE: list[Any] = [
    None,
    0,
    -1,
    -5,
    2.5,
    4.7,
    10**12,
    2**63,
    "x",
    "",
    [4, 4],
    {"a": 1},
    True,
    False,
    float("nan"),
    float("inf"),
    1e-300,
    [[[[]]]],
]
BAD_PATHS = ["/etc/passwd", "../x.distcp", "", "missing.distcp", "..", "a/../../b", "~/x"]


class Hang(BaseException):
    """A load ran past :data:`PER_LOAD_S` (a BaseException: nothing in the readers catches it)."""


def _alarm(signum, frame):
    raise Hang


def _attempt(load: Callable[[], Any], what: str, problems: list[str]) -> None:
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(PER_LOAD_S)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load()
    except (ValueError, OSError):
        pass  # a clear error (ConversionError, CheckpointError, ConfigError, ...)
    except Hang:
        problems.append(f"{what}: no answer in {PER_LOAD_S} s")
    except Exception as exc:  # noqa: BLE001 - what the test looks for
        problems.append(f"{what}: raw {type(exc).__name__}: {str(exc)[:200]}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    hostile.hf_folder(root / "gpt2")
    hostile.hf_folder(root / "llama", "llama")
    hostile.megatron_folder(root / "meg")
    hostile.megatron_folder(root / "dist", fmt="torch_dist")
    hostile.nemo_folder(root / "nemo")
    hostile.epochal_run(root / "run")
    return root


def _fresh(built: Path, name: str, work: Path) -> Path:
    target = work / name
    if target.exists():
        shutil.rmtree(target)
    return Path(shutil.copytree(built / name, target))


def _mutate_mapping(rng: random.Random, data: dict[str, Any], keys: list[str]) -> str:
    key = rng.choice(keys)
    if rng.random() < 0.15:
        data.pop(key, None)
        return f"del {key}"
    value = rng.choice(HOSTILE)
    data[key] = value
    return f"{key}={value!r}"


def _hf_cases(rng: random.Random, built: Path, work: Path, n: int, problems: list[str]) -> None:
    for i in range(n):
        arch = rng.choice(["gpt2", "llama"])
        folder = _fresh(built, arch, work)
        config = json.loads((folder / "config.json").read_text())
        changes = [_mutate_mapping(rng, config, sorted(config)) for _ in range(rng.randint(1, 3))]
        (folder / "config.json").write_text(json.dumps(config))
        _attempt(lambda f=folder: load_hf_checkpoint(f), f"hf {arch} #{i} {changes}", problems)


def _megatron_cases(rng, built, work, n, problems) -> None:
    for i in range(n):
        folder = _fresh(built, "meg", work)
        path = hostile.rank_file(folder)
        payload = torch.load(path, weights_only=False)
        args = vars(payload["args"])
        changes = [_mutate_mapping(rng, args, sorted(args)) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.2:
            name = rng.choice(sorted(payload["model"]))
            payload["model"][name] = rng.choice(["a string", 3, torch.zeros(3)])
            changes.append(f"model[{name}] replaced")
        if rng.random() < 0.1:
            payload["checkpoint_version"] = rng.choice([0, 1.0, -1, "x", 7])
            changes.append(f"checkpoint_version={payload['checkpoint_version']!r}")
        torch.save(payload, path)
        _attempt(lambda f=folder: load_megatron_checkpoint(f), f"megatron #{i} {changes}", problems)


def _metadata_change(rng: random.Random, metadata: Any) -> str:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    tensors = [
        (k, m)
        for k, m in metadata.state_dict_metadata.items()
        if isinstance(m, TensorStorageMetadata)
    ]
    fqn, meta = rng.choice(tensors)
    kind = rng.randrange(5)
    if kind == 0 and len(meta.size):
        dim = rng.randrange(len(meta.size))
        sizes = list(meta.size)
        sizes[dim] = rng.choice([sizes[dim] + 1, sizes[dim] - 1, 0, -1, 10**12, 2**62])
        meta.size = torch.Size(sizes) if min(sizes) >= 0 else tuple(sizes)
        return f"{fqn} size {sizes}"
    if kind == 1 and meta.chunks and len(meta.size):
        chunk = rng.choice(meta.chunks)
        dim = rng.randrange(len(meta.size))
        field = rng.choice(["offsets", "sizes"])
        values = list(getattr(chunk, field))
        values[dim] = rng.choice([values[dim] + 1, values[dim] - 1, 10**12, -3])
        setattr(chunk, field, tuple(values))
        return f"{fqn} chunk {field} {values}"
    if kind == 2 and meta.chunks:
        meta.chunks.pop(rng.randrange(len(meta.chunks)))
        return f"{fqn} chunk removed"
    info = rng.choice(list(metadata.storage_data.values()))
    if kind == 3:
        field = rng.choice(["offset", "length"])
        setattr(info, field, rng.choice([0, -1, 10**15, getattr(info, field) + 7, "x"]))
        return f"storage {field}={getattr(info, field)!r}"
    info.relative_path = rng.choice(BAD_PATHS)
    return f"relative_path={info.relative_path!r}"


def _damage_file(rng: random.Random, path: Path) -> str:
    data = bytearray(path.read_bytes())
    if rng.random() < 0.5 or not data:
        cut = rng.randrange(len(data) + 1)
        path.write_bytes(bytes(data[:cut]))
        return f"{path.name} truncated to {cut}"
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return f"{path.name} bytes flipped"


def _dcp_cases(rng, built, work, n, problems, *, name: str, inner: str, load) -> None:
    for i in range(n):
        folder = _fresh(built, name, work)
        dcp = folder / inner if inner else next((folder / "checkpoints").glob("step_*"))
        (dcp / "manifest.json").unlink(missing_ok=True)
        if rng.random() < 0.7:
            changes: list[str] = []
            hostile.edit_metadata(dcp, lambda m, c=changes: c.append(_metadata_change(rng, m)))
        else:
            changes = [_damage_file(rng, rng.choice(sorted(dcp.glob("*.distcp"))))]
        _attempt(lambda f=folder: load(f), f"{name} #{i} {changes}", problems)


def _nemo_cases(rng, built, work, n, problems) -> None:
    import yaml

    for i in range(n):
        folder = _fresh(built, "nemo", work)
        path = folder / "context" / "model.yaml"
        if rng.random() < 0.8:
            doc = yaml.safe_load(path.read_text())
            config = doc["config"]
            changes = [
                _mutate_mapping(rng, config, sorted(config)) for _ in range(rng.randint(1, 3))
            ]
            path.write_text(yaml.safe_dump(doc))
        else:
            text = path.read_text()
            cut = rng.randrange(len(text))
            path.write_text(
                text[:cut]
                + rng.choice(["", "&a [*a]", "{", ": :", "\t", "!!python/object:os.system {}"])
            )
            changes = [f"text cut at {cut}"]
        _attempt(lambda f=folder: load_megatron_checkpoint(f), f"nemo #{i} {changes}", problems)


def _epochal_cases(rng, built, work, n, problems) -> None:
    for i in range(n):
        folder = _fresh(built, "run", work)
        step = next((folder / "checkpoints").glob("step_*"))
        (step / "manifest.json").unlink(missing_ok=True)
        state = json.loads((step / "trainer_state.json").read_text())
        target = state["model_config"] if rng.random() < 0.8 else state
        changes = [_mutate_mapping(rng, target, sorted(target)) for _ in range(rng.randint(1, 2))]
        (step / "trainer_state.json").write_text(json.dumps(state))
        _attempt(lambda f=folder: load_epochal_checkpoint(f), f"epochal #{i} {changes}", problems)


def test_readers_survive_seeded_mutations(built, tmp_path):
    rng = random.Random(26)
    problems: list[str] = []
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _hf_cases(rng, built, tmp_path, 80, problems)
    _megatron_cases(rng, built, tmp_path, 60, problems)
    _dcp_cases(
        rng,
        built,
        tmp_path,
        60,
        problems,
        name="dist",
        inner="iter_0000005",
        load=load_megatron_checkpoint,
    )
    _nemo_cases(rng, built, tmp_path, 50, problems)
    _dcp_cases(
        rng, built, tmp_path, 30, problems, name="run", inner="", load=load_epochal_checkpoint
    )
    _epochal_cases(rng, built, tmp_path, 40, problems)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert not problems, f"{len(problems)} of 320 mutations:\n" + "\n".join(problems[:40])
    assert grown_mb < RSS_BOUND_MB, f"peak memory grew by {grown_mb:.0f} MB"
