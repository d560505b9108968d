"""Seeded O(1)-memory permutations of ``range(length)`` and the counter-based hash behind them.

``permute(i, n, seed)`` is the ``i``-th element of a pseudo-random permutation of
``range(n)`` chosen by ``seed``, computed in O(1) time and memory, without
materializing the permutation. ``permute_array`` maps a whole numpy array at once
and gives exactly the same results as the scalar form.

Construction: a Feistel network over ``2**k`` values (``k`` the number of bits of
``n - 1``, so ``2**k < 2 * n``; 6 rounds, 8 to 16 for domains below ``2**16``
where fewer rounds are measurably non-uniform), with round functions
``mix64(right ^ round_key)`` (the splitmix64 finalizer), and *cycle-walking*:
values that land in ``[n, 2**k)`` are encrypted again until they fall into
``range(n)``. A Feistel network is a bijection for any round function, and
cycle-walking a bijection restricted to a subset is a bijection of that subset,
so the result is a true permutation for every ``n`` in ``1 .. MAX_LENGTH``
(``2**63``), unlike BioNeMo's hashed permutation (which rejects ``n == 1`` and is
only a permutation below ``2**32``). The halves may differ by one bit (odd
``k``); the widths alternate between rounds, which keeps each round invertible.
On average fewer than 2 encryptions are needed per index.

The same module provides the seed-mixing helpers used across ``epochal.data``:
:func:`mix64` and :func:`derive_seed` (a 64-bit hash of ``(seed, *words)``), with
array forms. Seeds and words are integers in ``[0, 2**64)``.
"""

from __future__ import annotations

import operator
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = [
    "MAX_LENGTH",
    "MAX_SEED",
    "derive_seed",
    "derive_seed_array",
    "mix64",
    "mix64_array",
    "permute",
    "permute_array",
    "permute_grouped",
]

MASK64 = (1 << 64) - 1
MAX_SEED = MASK64
"""Largest accepted seed (seeds and hashed words are integers in ``[0, 2**64)``)."""
MAX_LENGTH = 1 << 63
"""Largest permutable length: every index then fits in an ``int64``."""

_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio, the splitmix64 increment
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_SEED_SALT = 0x6A09E667F3BCC909
_WORD_SALT = 0xBB67AE8584CAA73B
_CHUNK = 1 << 16  # elements per vectorized block: keeps temporaries in cache

_U_M1 = np.uint64(_M1)
_U_M2 = np.uint64(_M2)


def _check_bounded_int(value: Any, name: str, low: int, high: int, text: str) -> int:
    """``value`` as an int in ``[low, high]`` (``text`` spells the range in errors).

    Raises:
        TypeError: not an integer.  ValueError: outside the range.
    """
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be in {text}, got {value}")
    return value


def _check_u64(value: Any, name: str) -> int:
    return _check_bounded_int(value, name, 0, MASK64, "[0, 2**64)")


def _check_length(length: Any) -> int:
    return _check_bounded_int(length, "length", 1, MAX_LENGTH, "[1, 2**63]")


def mix64(x: int) -> int:
    """Return the splitmix64 finalizer of ``x``: a 64-bit bijective avalanche hash.

    Args:
        x: an integer; only its low 64 bits are used.

    Returns:
        An integer in ``[0, 2**64)``.
    """
    z = x & MASK64
    z = ((z ^ (z >> 30)) * _M1) & MASK64
    z = ((z ^ (z >> 27)) * _M2) & MASK64
    return z ^ (z >> 31)


def _mix64_inplace(z: np.ndarray) -> np.ndarray:
    z ^= z >> 30
    z *= _U_M1
    z ^= z >> 27
    z *= _U_M2
    z ^= z >> 31
    return z


def mix64_array(x: np.ndarray) -> np.ndarray:
    """Vectorized :func:`mix64`.

    Args:
        x: an integer array of any shape (values are taken modulo ``2**64``).

    Returns:
        A new ``uint64`` array of the same shape.
    """
    return _mix64_inplace(np.array(x, dtype=np.uint64, copy=True))


def derive_seed(seed: int, *words: int) -> int:
    """Hash ``(seed, *words)`` to a new 64-bit seed, e.g. a per-epoch seed from ``(seed, epoch)``.

    Changing any argument (or the number of words) gives an unrelated value; there
    is no table, so any number of epochs or samples costs no memory.

    Args:
        seed: integer in ``[0, 2**64)``.
        *words: integers in ``[0, 2**64)``.

    Returns:
        An integer in ``[0, 2**64)``.

    Raises:
        ValueError: an argument is negative or ``>= 2**64``.
        TypeError: an argument is not an integer.
    """
    h = mix64(_check_u64(seed, "seed") ^ _SEED_SALT)
    for i, w in enumerate(words):
        h = mix64(h ^ mix64(_check_u64(w, f"word {i}") + _WORD_SALT))
    return h


def _as_u64_array(value: Any, name: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        if arr.dtype == object:  # Python ints too large for int64 but within uint64
            return np.asarray([_check_u64(v, name) for v in arr.ravel()], dtype=np.uint64).reshape(
                arr.shape
            )
        raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
    if arr.size and np.issubdtype(arr.dtype, np.signedinteger) and arr.min() < 0:
        raise ValueError(f"{name} must be non-negative, got minimum {arr.min()}")
    return arr.astype(np.uint64, copy=False)


def derive_seed_array(seed: int | np.ndarray, *words: int | np.ndarray) -> np.ndarray:
    """Vectorized :func:`derive_seed`; arguments broadcast against each other.

    Args:
        seed: integer or integer array, values in ``[0, 2**64)``.
        *words: integers or integer arrays, values in ``[0, 2**64)``.

    Returns:
        ``uint64`` array of the broadcast shape; element ``j`` equals
        ``derive_seed(seed[j], *(w[j] for w in words))``.

    Raises:
        ValueError: a negative value. TypeError: a non-integer array.
    """
    h = _as_u64_array(seed, "seed") ^ np.uint64(_SEED_SALT)
    h = _mix64_inplace(np.array(h, dtype=np.uint64, copy=True))
    for i, w in enumerate(words):
        wv = _as_u64_array(w, f"word {i}") + np.uint64(_WORD_SALT)
        h = _mix64_inplace(h ^ _mix64_inplace(np.array(wv, dtype=np.uint64, copy=True)))
    return h


def _num_rounds(bits: int) -> int:
    """Feistel rounds for a ``2**bits`` domain (even, so the half widths end where they began).

    Tiny domains need more rounds: with 1-4 bit halves, few rounds leave the cycle-walked
    permutation measurably non-uniform (chi-square of positions over many seeds).
    """
    if bits <= 4:
        return 16
    if bits <= 8:
        return 12
    if bits <= 16:
        return 8
    return 6


@lru_cache(maxsize=4096)
def _round_keys(seed: int, bits: int) -> tuple[int, ...]:
    base = derive_seed(seed, bits)
    return tuple(mix64(base + (r + 1) * _GOLDEN) for r in range(_num_rounds(bits)))


def _round_keys_array(seeds: np.ndarray, bits: int) -> list[np.ndarray]:
    base = derive_seed_array(seeds, bits)
    return [
        _mix64_inplace(base + np.uint64(((r + 1) * _GOLDEN) & MASK64))
        for r in range(_num_rounds(bits))
    ]


def _encrypt_int(x: int, bits: int, keys: tuple[int, ...]) -> int:
    # Two Feistel rounds per iteration, written without the swap: round 2k updates the
    # high part (width bits - bits // 2) from the low part, round 2k + 1 the reverse.
    hr = bits // 2
    mask_l, mask_r = (1 << (bits - hr)) - 1, (1 << hr) - 1
    left, right = x >> hr, x & mask_r
    for i in range(0, len(keys), 2):
        z = right ^ keys[i]
        z = ((z ^ (z >> 30)) * _M1) & MASK64
        z = ((z ^ (z >> 27)) * _M2) & MASK64
        left ^= (z ^ (z >> 31)) & mask_l
        z = left ^ keys[i + 1]
        z = ((z ^ (z >> 30)) * _M1) & MASK64
        z = ((z ^ (z >> 27)) * _M2) & MASK64
        right ^= (z ^ (z >> 31)) & mask_r
    return (left << hr) | right


def _round_function_into(
    src: np.ndarray, key: Any, mask: np.uint64, f: np.ndarray, tmp: np.ndarray
) -> None:
    """``f = mix64(src ^ key) & mask`` on preallocated buffers."""
    np.bitwise_xor(src, key, out=f)
    np.right_shift(f, np.uint64(30), out=tmp)
    f ^= tmp
    f *= _U_M1
    np.right_shift(f, np.uint64(27), out=tmp)
    f ^= tmp
    f *= _U_M2
    np.right_shift(f, np.uint64(31), out=tmp)
    f ^= tmp
    f &= mask


def _encrypt_array(x: np.ndarray, bits: int, keys: list[Any]) -> np.ndarray:
    hr = bits // 2
    mask_l, mask_r = np.uint64((1 << (bits - hr)) - 1), np.uint64((1 << hr) - 1)
    left = x >> np.uint64(hr)
    right = x & mask_r
    f = np.empty_like(left)
    tmp = np.empty_like(left)
    for i in range(0, len(keys), 2):  # same round pairs as _encrypt_int
        _round_function_into(right, keys[i], mask_l, f, tmp)
        left ^= f
        _round_function_into(left, keys[i + 1], mask_r, f, tmp)
        right ^= f
    left <<= np.uint64(hr)
    left |= right
    return left


def permute(index: int, length: int, seed: int) -> int:
    """Return element ``index`` of the permutation of ``range(length)`` chosen by ``seed``.

    For a fixed ``(length, seed)``, ``index -> permute(index, length, seed)`` is a
    bijection of ``range(length)``; O(1) time and memory.

    Args:
        index: position in ``[0, length)``.
        length: size of the permuted range, ``1 <= length <= 2**63``.
        seed: integer in ``[0, 2**64)``; different seeds give unrelated permutations.

    Returns:
        An integer in ``[0, length)``.

    Raises:
        ValueError: ``index``, ``length`` or ``seed`` is out of range.
        TypeError: an argument is not an integer.
    """
    length = _check_length(length)
    seed = _check_u64(seed, "seed")
    try:
        index = operator.index(index)
    except TypeError:
        raise TypeError(f"index must be an integer, got {type(index).__name__}") from None
    if not 0 <= index < length:
        raise ValueError(f"index must be in [0, {length}), got {index}")
    if length == 1:
        return 0
    bits = (length - 1).bit_length()
    keys = _round_keys(seed, bits)
    x = _encrypt_int(index, bits, keys)
    while x >= length:  # cycle-walk back into range(length)
        x = _encrypt_int(x, bits, keys)
    return x


def permute_array(indices: np.ndarray, length: int, seed: int | np.ndarray) -> np.ndarray:
    """Vectorized :func:`permute`: map every element of ``indices`` at once.

    Args:
        indices: integer array of any shape, values in ``[0, length)``.
        length: size of the permuted range, ``1 <= length <= 2**63``.
        seed: integer in ``[0, 2**64)``, or an integer array broadcastable to
            ``indices.shape`` giving each element its own permutation seed (used to map
            indices of several epochs in one call).

    Returns:
        ``int64`` array of ``indices.shape`` with
        ``out[j] == permute(indices[j], length, seed[j])``.

    Raises:
        ValueError: a value of ``indices`` or ``seed``, or ``length``, is out of range.
        TypeError: ``indices`` or ``seed`` is not integer.
    """
    length = _check_length(length)
    arr = np.asarray(indices)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"indices must be an integer array, got dtype {arr.dtype}")
    shape = arr.shape
    x = arr.reshape(-1)
    if x.size:
        lo, hi = x.min(), x.max()
        if lo < 0 or hi >= length:
            bad = lo if lo < 0 else hi
            raise ValueError(f"indices must be in [0, {length}), got {bad}")
    if np.ndim(seed) > 0:
        seeds = np.broadcast_to(_as_u64_array(seed, "seed"), shape).reshape(-1)
        table, group = np.unique(seeds, return_inverse=True)
        return permute_grouped(x, length, table, group.reshape(-1)).reshape(shape)
    return permute_grouped(
        x, length, np.array([_check_u64(seed, "seed")], dtype=np.uint64)
    ).reshape(shape)


def permute_grouped(
    indices: np.ndarray, length: int, seed_table: np.ndarray, group: np.ndarray | None = None
) -> np.ndarray:
    """Map indices that use a few distinct seeds: ``out[j] = permute(indices[j], length, seed_table[group[j]])``.

    The round keys are derived once per entry of ``seed_table`` and gathered, which is
    how a sampler maps random global indices spread over many epochs. Inputs are
    trusted (no range checks): validate with :func:`permute_array` semantics first.

    Args:
        indices: 1-D non-negative integer array, values in ``[0, length)``.
        length: size of the permuted range, ``1 <= length <= 2**63``.
        seed_table: 1-D ``uint64`` array of seeds.
        group: 1-D integer array (same length as ``indices``) of positions in
            ``seed_table``; ``None`` means every index uses ``seed_table[0]``.

    Returns:
        1-D ``int64`` array.
    """
    x = np.asarray(indices).astype(np.uint64, copy=False)
    out = np.zeros(x.shape, dtype=np.int64)
    if length == 1 or x.size == 0:
        return out
    bits = (length - 1).bit_length()
    if group is None:
        scalar_keys = [np.uint64(k) for k in _round_keys(int(seed_table[0]), bits)]
    else:
        key_table = _round_keys_array(np.asarray(seed_table, dtype=np.uint64), bits)
    n = np.uint64(length)
    for start in range(0, x.size, _CHUNK):
        stop = min(start + _CHUNK, x.size)
        if group is None:
            keys: list[Any] = scalar_keys
        else:
            g = group[start:stop]
            keys = [k[g] for k in key_table]
        y = _encrypt_array(x[start:stop], bits, keys)
        todo = np.flatnonzero(y >= n)
        sub_keys = keys if group is None else [k[todo] for k in keys]
        while todo.size:  # cycle-walk only the elements still outside range(length)
            sub = _encrypt_array(y[todo], bits, sub_keys)
            y[todo] = sub
            still = sub >= n
            todo = todo[still]
            if group is not None:
                sub_keys = [k[still] for k in sub_keys]
        out[start:stop] = y.view(np.int64)
    return out
