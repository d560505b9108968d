"""GPT index build and sample reads: epochal (numpy) vs Megatron-Core (compiled helpers).

Prints one table. Rows:

- ``GPTDataset index build``: the whole constructor of each ``GPTDataset`` (document
  index, sample index, shuffle index; no cache) over ``--documents`` documents,
  for one epoch and for several epochs (with a separated final epoch);
- ``sample index only``: ``build_sample_index`` vs Megatron's C++ ``build_sample_idx``
  (both gather the lengths of the shuffled documents);
- ``blend indices``: the greedy blend of ``--blend-size`` samples over 2 datasets (two
  weight pairs: one whose products hit whole numbers every tenth sample, one that does
  not), 5 datasets and ``--blend-datasets`` random weights (a closed form for two
  datasets and a vectorized numpy scan for more here, a C++ loop in Megatron);
- ``samples/s read``: random samples read through each ``GPTDataset`` from the same
  ``.bin``/``.idx`` files (epochal's reader vs Megatron's).

Every epochal result is checked equal to Megatron-Core's. Each row runs the two
implementations ``--repeats`` times, alternating (so both see the same load on a shared
machine); it prints each side's median time (wall clock, or CPU time with ``--clock
cpu``), the median of the per-repeat speedups and their range (the ratio is what to
compare across machines).

Run: ``python benchmarks/bench_gpt_index.py`` (defaults: 10M documents, ~2 minutes);
``--only blend --blend-datasets 100 --blend-size 100000000`` times a large blend alone.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import tempfile
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)  # Megatron logs a warning per dataset built without a cache


class Lengths:
    """A corpus known only by its document lengths (enough to build the indices)."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.sequence_lengths = lengths
        self.path_prefix = None

    def get(self, idx, offset=0, length=None):  # pragma: no cover - indices only
        raise RuntimeError("the index benchmark reads no tokens")


class DuckTokenizer:
    vocab_size = 50257
    eod = 0
    unique_identifiers = {"class": "DuckTokenizer"}


class Timing:
    """The seconds of ``repeats`` alternating runs of both sides."""

    def __init__(self, ours: list[float], theirs: list[float]) -> None:
        self.ours, self.theirs = np.array(ours), np.array(theirs)

    @property
    def ours_median(self) -> float:
        return float(np.median(self.ours))

    @property
    def theirs_median(self) -> float:
        return float(np.median(self.theirs))

    def speedup(self) -> str:
        """Median of the per-repeat ratios ``theirs / ours``, and their range."""
        ratios = self.theirs / self.ours
        return f"{np.median(ratios):.2f}x ({ratios.min():.2f}-{ratios.max():.2f})"


#: The clock of every timing: wall clock, or this process's CPU time (``--clock cpu``: on a
#: machine shared with other jobs it leaves out the time spent waiting for a core).
CLOCK = time.perf_counter


def compare(repeats: int, ours_fn, theirs_fn):
    """Run both ``repeats`` times, alternating, so that both see the same load.

    Each result is freed before the other side runs (the last repeat's are kept for the
    equality checks): otherwise the side that runs second would be the one allocating
    fresh memory, whose page faults can cost as much as a small blend.

    Returns ``(timing, ours, theirs)``: the :class:`Timing` and the last results.
    """
    ours_times, theirs_times, ours, theirs = [], [], None, None
    for r in range(repeats):
        keep = r == repeats - 1
        t = CLOCK()
        theirs = theirs_fn()
        theirs_times.append(CLOCK() - t)
        if not keep:
            theirs = None
        t = CLOCK()
        ours = ours_fn()
        ours_times.append(CLOCK() - t)
        if not keep:
            ours = None
    return Timing(ours_times, theirs_times), ours, theirs


def megatron_config(seq_length: int, seed: int):
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    return GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        tokenizer=DuckTokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
    )  # no blend: mock=True, so Megatron builds in memory without a cache, as we do


def bench_build(args, rows):
    from megatron.core.datasets import helpers
    from megatron.core.datasets.gpt_dataset import GPTDataset as MGPTDataset
    from megatron.core.datasets.utils import Split

    from epochal.data.datasets.gpt_dataset import GPTDataset
    from epochal.data.datasets.gpt_indices import build_sample_index

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 2 * args.mean_length, size=args.documents, dtype=np.int32)
    corpus = Lengths(lengths)
    documents = np.arange(args.documents, dtype=np.int32)
    tokens = int(lengths.sum(dtype=np.int64))
    per_epoch = (tokens - 1) // args.seq_length
    config = megatron_config(args.seq_length, 1234)
    for label, num_samples in (("1 epoch", None), ("2.5 epochs", int(per_epoch * 2.5))):
        timing, ours, theirs = compare(
            args.repeats,
            lambda n=num_samples: GPTDataset(corpus, documents, n, args.seq_length, 1234),
            lambda n=num_samples: MGPTDataset(corpus, None, documents, n, Split.train, config),
        )
        for name in ("document_index", "sample_index", "shuffle_index"):
            assert np.array_equal(getattr(ours, name), getattr(theirs, name)), name
        rows.append(
            (
                f"GPTDataset index build, {args.documents / 1e6:g}M docs, {label}",
                f"{timing.ours_median:.2f} s",
                f"{timing.theirs_median:.2f} s",
                timing.speedup(),
            )
        )
        if num_samples is None:
            doc_index = np.array(ours.document_index)
            epochs = 1
        del ours, theirs
    sizes = lengths.copy()
    timing, ours, theirs = compare(
        args.repeats,
        lambda: build_sample_index(sizes, doc_index, args.seq_length, epochs, tokens, True, True),
        lambda: helpers.build_sample_idx(
            sizes, doc_index, args.seq_length, epochs, tokens, True, True
        ),
    )
    assert np.array_equal(ours, theirs)
    rows.append(
        (
            "sample index only (1 epoch)",
            f"{timing.ours_median:.2f} s",
            f"{timing.theirs_median:.2f} s",
            timing.speedup(),
        )
    )


def bench_blend(args, rows):
    from megatron.core.datasets import helpers

    from epochal.data.datasets.blended_dataset import build_blending_indices, normalize_weights

    blends = [[0.3, 0.7], [0.31234, 0.68766], [5, 1, 2, 0.5, 3]]
    if args.blend_datasets:
        blends.append((np.random.default_rng(2).random(args.blend_datasets) + 0.01).tolist())
    for weights in blends:
        w = normalize_weights(weights)

        def theirs_fn(w=w):
            ds = np.zeros(args.blend_size, dtype=np.int16)
            sample = np.zeros(args.blend_size, dtype=np.int64)
            helpers.build_blending_indices(ds, sample, w, len(w), args.blend_size, False)
            return ds, sample

        repeats = args.repeats if args.blend_size * len(w) <= 10**8 else 1
        timing, ours, theirs = compare(
            repeats, lambda w=w: build_blending_indices(w, args.blend_size), theirs_fn
        )
        assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1])
        shown = ", ".join(f"{x:g}" for x in weights) if len(w) <= 5 else "random weights"
        rows.append(
            (
                f"blend indices, {len(w)} datasets ({shown}), {args.blend_size / 1e6:g}M samples",
                f"{timing.ours_median:.3f} s",
                f"{timing.theirs_median:.3f} s",
                timing.speedup(),
            )
        )


def bench_read(args, rows):
    from megatron.core.datasets.gpt_dataset import GPTDataset as MGPTDataset
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MIndexedDataset
    from megatron.core.datasets.utils import Split

    from epochal.data.datasets.gpt_dataset import GPTDataset
    from epochal.data.indexed.indexed_dataset import IndexedDataset, write_indexed_dataset

    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as root:
        docs = (
            rng.integers(1, 50000, size=int(rng.integers(16, 2 * args.mean_length)), dtype=np.int64)
            for _ in range(args.read_documents)
        )
        prefix = write_indexed_dataset(os.path.join(root, "corpus"), docs, dtype=np.uint16)
        ours_ds = GPTDataset(IndexedDataset(prefix), None, None, args.seq_length, 7)
        theirs_ds = MGPTDataset(
            MIndexedDataset(prefix),
            None,
            ours_ds.documents,
            None,
            Split.train,
            megatron_config(args.seq_length, 7),
        )
        order = rng.integers(0, len(ours_ds), size=args.read_samples)
        for i in order[:50]:
            assert np.array_equal(
                ours_ds[int(i)]["tokens"].numpy(), theirs_ds[int(i)]["tokens"].numpy()
            )
        timing, _, _ = compare(
            args.repeats,
            lambda: [ours_ds[int(i)] for i in order],
            lambda: [theirs_ds[int(i)] for i in order],
        )
        rows.append(
            (
                f"samples/s read, seq {args.seq_length}, random order",
                f"{len(order) / timing.ours_median:,.0f}/s",
                f"{len(order) / timing.theirs_median:,.0f}/s",
                timing.speedup(),
            )
        )


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (Linux), else what the platform says."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--documents", type=int, default=10_000_000, help="documents for the index build"
    )
    parser.add_argument(
        "--mean-length", type=int, default=500, help="mean document length (tokens)"
    )
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument(
        "--repeats", type=int, default=5, help="alternating runs per row (medians are shown)"
    )
    parser.add_argument(
        "--blend-size", type=int, default=1_000_000, help="samples of the blend benchmark"
    )
    parser.add_argument(
        "--read-documents", type=int, default=20_000, help="documents of the read benchmark"
    )
    parser.add_argument("--read-samples", type=int, default=5_000, help="samples read per run")
    parser.add_argument(
        "--blend-datasets",
        type=int,
        default=100,
        help="also blend this many datasets with random weights (0: only the 2- and 5-dataset rows)",
    )
    parser.add_argument(
        "--only", choices=("build", "blend", "read"), action="append", help="run these parts only"
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time by the wall clock, or by this process's CPU time (steadier on a shared machine)",
    )
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} cores; numpy {np.__version__}; "
        f"{args.clock} clock, {args.repeats} alternating repeats"
    )
    rows: list[tuple[str, str, str, str]] = []
    parts = {"build": bench_build, "blend": bench_blend, "read": bench_read}
    for name, run in parts.items():
        if not args.only or name in args.only:
            run(args, rows)
    header = ("benchmark", "epochal", "megatron-core", "speedup (range)")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))


if __name__ == "__main__":
    main()
