"""Checks that a dataset is safe under Megatron: the same sample for the same index everywhere.

Run these in your own test suite::

    from epochal.testing import assert_dataset_compatible_with_megatron

    def test_my_dataset_is_megatron_compatible():
        assert_dataset_compatible_with_megatron(MyDataset(...), index=EpochIndex(0, 3))

Names and signatures follow BioNeMo's ``bionemo.testing.data_utils``; the checks go
further: any seeding of or draw from a global generator (torch, numpy, Python
``random``) inside ``__getitem__`` is caught, samples may be arbitrary nested
containers of tensors/arrays/scalars, and :func:`assert_dataset_deterministic_across_processes`
recomputes samples in a freshly started process with different global seeds,
hash seed and rank variables.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import pickletools
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from epochal.testing.compare import assert_samples_equal
from epochal.testing.global_rng import detect_global_rng_use, preserve_global_rng

__all__ = [
    "DatasetDistributedNondeterministic",
    "DatasetLocallyNondeterministic",
    "assert_dataset_compatible_with_megatron",
    "assert_dataset_deterministic_across_processes",
    "assert_dataset_elements_not_equal",
]

Comparator = Callable[[Any, Any], None]

_CHILD_SEED = 0xC0FFEE


class DatasetLocallyNondeterministic(AssertionError):
    """``dataset[index]`` returned different values for two calls in the same process."""


class DatasetDistributedNondeterministic(AssertionError):
    """``dataset[index]`` depends on per-process state (global RNGs, hash seed, rank, ...)."""


def assert_dataset_compatible_with_megatron(
    dataset: Any,
    index: Any = 0,
    assert_elements_equal: Comparator = assert_samples_equal,
    *,
    check_other_process: bool = False,
) -> None:
    """Assert that ``dataset[index]`` is deterministic and uses no global random state.

    Checks, in order:

    1. two calls ``dataset[index]`` return equal samples (else
       :class:`DatasetLocallyNondeterministic`);
    2. ``dataset[index]`` neither seeds nor draws from a global generator, and its
       value does not change when the global generators are in a different state
       (else :class:`DatasetDistributedNondeterministic`, listing what was used);
    3. with ``check_other_process=True``,
       :func:`assert_dataset_deterministic_across_processes` (spawns one Python process).

    Args:
        dataset: the dataset (``len(dataset) >= 1``).
        index: the key to test: an ``int`` or an ``EpochIndex`` for multi-epoch datasets.
        assert_elements_equal: comparator that raises ``AssertionError`` when two samples
            differ; default :func:`~epochal.testing.compare.assert_samples_equal` (exact).
        check_other_process: also recompute the sample in a fresh process.

    Raises:
        DatasetLocallyNondeterministic: step 1 failed.
        DatasetDistributedNondeterministic: step 2 or 3 failed.
        ValueError: the dataset is empty.
    """
    if len(dataset) < 1:
        raise ValueError("the dataset is empty; need at least one element to test")
    with preserve_global_rng():  # the check leaves the caller's global state untouched
        first, second = dataset[index], dataset[index]
    try:
        assert_elements_equal(first, second)
    except AssertionError as err:
        raise DatasetLocallyNondeterministic(
            f"dataset[{index!r}] returned different values on two calls: {err}"
        ) from err
    with detect_global_rng_use() as findings:
        third = dataset[index]
    if findings:
        raise DatasetDistributedNondeterministic(
            f"dataset[{index!r}] uses global random state, which differs between ranks; "
            "draw from a local torch.Generator / np.random.Generator seeded from the index "
            "instead:\n  - " + "\n  - ".join(findings)
        )
    try:
        assert_elements_equal(first, third)
    except AssertionError as err:
        raise DatasetDistributedNondeterministic(
            f"dataset[{index!r}] changed when the global random state changed: {err}"
        ) from err
    if check_other_process:
        assert_dataset_deterministic_across_processes(
            dataset, [index], assert_elements_equal=assert_elements_equal
        )


def assert_dataset_elements_not_equal(
    dataset: Any,
    index_a: Any = 0,
    index_b: Any = 1,
    assert_elements_equal: Comparator = assert_samples_equal,
) -> None:
    """Assert that two keys give different samples, e.g. the same item in two epochs.

    Use it for datasets that apply randomness (masking, augmentation): pick two keys
    that map to the same underlying item (``EpochIndex(0, i)`` and ``EpochIndex(1, i)``)
    and check the randomness differs. Both keys are first checked with
    :func:`assert_dataset_compatible_with_megatron`.

    Raises:
        DatasetLocallyNondeterministic, DatasetDistributedNondeterministic: see above.
        AssertionError: the two samples are equal.
    """
    assert_dataset_compatible_with_megatron(dataset, index_a, assert_elements_equal)
    assert_dataset_compatible_with_megatron(dataset, index_b, assert_elements_equal)
    with preserve_global_rng():
        sample_a, sample_b = dataset[index_a], dataset[index_b]
    try:
        assert_elements_equal(sample_a, sample_b)
    except AssertionError:
        return
    raise AssertionError(
        f"dataset[{index_a!r}] and dataset[{index_b!r}] are equal; expected different samples"
    )


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *paths])
    parent_hash_seed = os.environ.get("PYTHONHASHSEED", "")
    env["PYTHONHASHSEED"] = (
        str(int(parent_hash_seed) + 1) if parent_hash_seed.isdigit() else "12345"
    )
    for name in ("RANK", "LOCAL_RANK", "GROUP_RANK"):
        value = os.environ.get(name, "0")
        env[name] = str(int(value) + 1) if value.isdigit() else "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


_IMPORTABLE = (
    "check_other_process=True (assert_dataset_deterministic_across_processes) needs the "
    "dataset's classes to be importable by a fresh Python process, not just picklable: "
    "define them at the top level of a module that `import` finds (not in __main__, a "
    "notebook cell, a script run directly, or inside a function or test)"
)


def _unimportable_globals(dataset: Any) -> list[str]:
    """Classes/functions the pickle of ``dataset`` names that a fresh process cannot import.

    Scans the ``GLOBAL`` opcodes of a protocol-2 pickle: names in ``__main__``, local
    names (``<locals>``) and modules without an import spec (made at run time). Returns
    ``[]`` when the dataset does not pickle at protocol 2 (the real pickle decides then).
    """
    try:
        payload = pickle.dumps(dataset, protocol=2, fix_imports=False)
    except Exception:  # noqa: BLE001 - only a pre-check
        return []
    bad: list[str] = []
    for opcode, arg, _ in pickletools.genops(payload):
        if opcode.name != "GLOBAL":
            continue
        module, name = str(arg).split(" ", 1)
        if module == "__main__" or "<locals>" in name:
            bad.append(f"{module}.{name}")
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # ValueError: a run-time module, __spec__ is None
            found = False
        if not found:
            bad.append(f"{module}.{name}")
    return sorted(set(bad))


def assert_dataset_deterministic_across_processes(
    dataset: Any,
    indices: Sequence[Any] = (0,),
    assert_elements_equal: Comparator = assert_samples_equal,
    *,
    timeout: float = 300.0,
) -> None:
    """Assert that a freshly started process computes the same samples as this one.

    The dataset is pickled and sent to a new Python interpreter whose global
    generators are seeded differently, whose ``PYTHONHASHSEED`` differs (so
    ``hash(str)`` differs) and whose ``RANK``/``LOCAL_RANK``/``GROUP_RANK`` variables
    differ; it computes ``dataset[i]`` for every ``i`` in ``indices`` and the results
    are compared to this process's. This catches state that differs between ranks and
    that the in-process checks cannot see. Costs one interpreter start (seconds).

    Args:
        dataset: a picklable dataset whose classes are importable by a fresh Python
            process: defined at the top level of an importable module, not in
            ``__main__`` (a script run directly, a notebook) or a function body.
            Picklable is not enough: the child imports the classes by name.
        indices: keys to compare.
        assert_elements_equal: comparator (default exact).
        timeout: seconds to wait for the child process.

    Raises:
        DatasetDistributedNondeterministic: a sample differs, or ``dataset[i]`` raised in
            the fresh process.
        TypeError: the dataset or an index cannot be pickled, or a class it pickles
            is not importable by a fresh process (the message names it).
        RuntimeError: the child process could not load the dataset, crashed or timed out.
    """
    indices = list(indices)
    try:
        payload = pickle.dumps((dataset, indices))
    except Exception as err:  # noqa: BLE001 - pickling can fail in many ways
        raise TypeError(
            f"the dataset must be picklable to be checked in another process ({err}); {_IMPORTABLE}"
        ) from err
    unimportable = _unimportable_globals((dataset, indices))
    if unimportable:
        raise TypeError(f"{_IMPORTABLE}; not importable: {', '.join(unimportable)}")
    with preserve_global_rng():
        local = [dataset[i] for i in indices]
    with tempfile.TemporaryDirectory(prefix="epochal-determinism-") as tmp:
        in_path, out_path = os.path.join(tmp, "in.pkl"), os.path.join(tmp, "out.pkl")
        with open(in_path, "wb") as f:
            f.write(payload)
        cmd = [
            sys.executable,
            "-m",
            "epochal.testing._process_check",
            in_path,
            out_path,
            str(_CHILD_SEED),
        ]
        try:
            proc = subprocess.run(
                cmd, env=_child_env(), capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as err:
            raise RuntimeError(f"the child process did not finish within {timeout} s") from err
        if proc.returncode != 0 or not os.path.exists(out_path):
            raise RuntimeError(
                f"the child process failed (exit status {proc.returncode}):\n{proc.stderr[-4000:]}"
            )
        with open(out_path, "rb") as f:
            status, value = pickle.load(f)  # written by our own child process
    if status == "load-error":
        raise RuntimeError(
            f"the child process could not unpickle the dataset; {_IMPORTABLE}:\n{value}"
        )
    if status == "getitem-error":
        raise DatasetDistributedNondeterministic(
            f"dataset[...] raised in a fresh process:\n{value}"
        )
    for index, mine, theirs in zip(indices, local, value):
        try:
            assert_elements_equal(theirs, mine)
        except AssertionError as err:
            raise DatasetDistributedNondeterministic(
                f"dataset[{index!r}] differs between this process and a fresh one "
                f"(different global seeds, hash seed and rank variables): {err}"
            ) from err
