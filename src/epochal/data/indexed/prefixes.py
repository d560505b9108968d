"""Indexed datasets named by prefix or by directory: find the complete ``.bin``/``.idx`` pairs.

A directory stands for every ``X.bin``/``X.idx`` pair in it, sorted by name (as
Megatron-LM's ``tools/merge_datasets.py --input DIR``).
"""

from __future__ import annotations

import os

from epochal.data.indexed.indexed_format import exists

__all__ = ["expand_inputs", "find_prefixes"]


def find_prefixes(directory: str) -> list[str]:
    """Return the prefixes of every complete ``.bin``/``.idx`` pair in ``directory``, sorted.

    Raises:
        FileNotFoundError: the directory holds no complete pair.
    """
    names = sorted(name[: -len(".idx")] for name in os.listdir(directory) if name.endswith(".idx"))
    prefixes = [
        os.path.join(directory, name) for name in names if exists(os.path.join(directory, name))
    ]
    if not prefixes:
        raise FileNotFoundError(f"directory {directory} holds no .bin/.idx pair")
    return prefixes


def expand_inputs(inputs: list[str]) -> list[str]:
    """Expand directories into their prefixes; check that every prefix exists.

    Raises:
        FileNotFoundError: an input is neither a directory nor a complete prefix.
    """
    prefixes: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            prefixes.extend(find_prefixes(item))
        elif exists(item):
            prefixes.append(item)
        else:
            raise FileNotFoundError(
                f"input {item} is neither a directory nor a prefix with .bin and .idx files"
            )
    return prefixes
