"""Child process of ``test_input_memory.py``: read one input, print the peak RSS it added.

Usage: ``python -m tests.data.memory_child KIND PATH [OUT_DIR]`` with KIND ``read`` (read
the proteins of PATH) or ``train`` (convert PATH into BioNeMo's layout under OUT_DIR, then
draw one 32-token ESM-2 sample of its first protein; for measurements by hand, see
``docs/reference/input-rules.md``). Prints one JSON line:
``{"outcome": "ok" | "<error class>: <message>", "added_mb": peak RSS added (MiB),
"residues": length of the first protein read}``. Only the reader's own modules are
imported before the baseline is taken (torch, pandas and pyarrow too, for ``train``).
"""

from __future__ import annotations

import json
import resource
import sys


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main(kind: str, path: str, out_dir: str = "") -> None:
    from epochal.data.proteins.readers import read_proteins

    if kind == "train":  # (the libraries' imports are not the reader's memory)
        import pandas  # noqa: F401
        import pyarrow.parquet  # noqa: F401
        import torch  # noqa: F401

        from epochal.data.proteins.esm_builders import build_esm_datasets
        from epochal.data.proteins.layout import proteins_to_bionemo_layout
    base = _peak_mb()
    residues = 0
    try:
        if kind == "read":
            for _, sequence, _ in read_proteins(path):
                residues = residues or len(sequence)
        else:
            layout = proteins_to_bionemo_layout(path, out_dir)
            train, _ = build_esm_datasets(
                str(layout.train_clusters),
                str(layout.database),
                train_samples=1,
                seed=0,
                max_seq_length=32,
            )
            residues = int(train[0]["text"].numel())
        outcome = "ok"
    except ValueError as exc:  # the readers' own errors
        outcome = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"outcome": outcome, "added_mb": _peak_mb() - base, "residues": residues}))


if __name__ == "__main__":
    main(*sys.argv[1:])
