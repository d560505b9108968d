"""Cost of the per-step sample digest: naming a global batch's samples vs reading them.

Every train record carries the digest of its global batch's sample identities
(:mod:`epochal.train.inputs.sample_identity`), computed on the logging rank. This
times, for a global batch of ``--batch`` samples of each kind of train data, the
identities plus the digest (what the trainer adds per step) against reading the
same samples (``dataset[g]``, what the data loader does anyway), alternating the
two, best of ``--repeats`` rounds after a warm-up:

- ``gpt``: Megatron's mock GPT corpus (``data.mock``), 2,048-token windows;
- ``gpt blend``: two mock corpora blended 30/70;
- ``esm``: the ``esm-tiny`` preset's synthetic protein families (``data.mock``);
- ``finetune``: a resampled table of 1,000 labelled protein rows.

Run::

    python benchmarks/bench_sample_digest.py           # ~1 minute on a 2-core CPU
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any


def _best(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _datasets(cache: str, batch: int) -> dict[str, Any]:
    from epochal.data import (
        BlendedDataset,
        GPTDataset,
        IdentityMultiEpochDatasetWrapper,
        MultiEpochDatasetResampler,
    )
    from epochal.data.datasets.labelled import LabelledSequenceDataset
    from epochal.data.datasets.mock_gpt import MockGPTLowLevelDataset
    from epochal.data.indexed.tokenizer_esm import ESM2Tokenizer
    from epochal.train.config import build_config
    from epochal.train.inputs.loaders import build_data

    samples = 20 * batch
    gpt = [
        GPTDataset(MockGPTLowLevelDataset(50_000, 49_999, seed=s), None, samples, 2048, seed=1)
        for s in (0, 1)
    ]
    esm = build_config(
        preset="esm-tiny",
        overrides=[f"--data.cache_dir={cache}", f"--run_dir={cache}/run", "--training.seed=1"],
    )
    rows = LabelledSequenceDataset(
        ["MKVLAAGIVG" * (1 + i % 30) for i in range(1000)],
        [str(i % 5) for i in range(1000)],
        ESM2Tokenizer(),
        task="sequence_regression",
        seq_length=512,
    )
    return {
        "gpt": gpt[0],
        "gpt blend": BlendedDataset(gpt, [0.3, 0.7], samples),
        "esm": build_data(esm).train_loader.dataset,
        "finetune": MultiEpochDatasetResampler(
            IdentityMultiEpochDatasetWrapper(rows), num_samples=samples, seed=1
        ),
    }


def main() -> None:
    from epochal.train.inputs.sample_identity import identity_digest, sample_identities

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512, help="global batch size (samples)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        data = _datasets(cache, args.batch)
        print(f"global batch of {args.batch} samples (starting at sample {3 * args.batch})")
        print(
            f"{'data':<10} {'digest ms':>10} {'us/sample':>10} {'read ms':>10} {'digest/read':>12}"
        )
        first, stop = 3 * args.batch, 4 * args.batch
        for name, ds in data.items():
            digest = _best(
                lambda ds=ds: identity_digest(sample_identities(ds, first, stop)), args.repeats
            )
            read = _best(lambda ds=ds: [ds[g] for g in range(first, stop)], args.repeats)
            print(
                f"{name:<10} {digest * 1e3:>10.2f} {digest / args.batch * 1e6:>10.1f} "
                f"{read * 1e3:>10.1f} {digest / read:>12.3f}"
            )


if __name__ == "__main__":
    main()
