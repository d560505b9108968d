"""Child side of the cross-process determinism check (``python -m epochal.testing._process_check``).

Usage: ``python -m epochal.testing._process_check IN.pkl OUT.pkl SEED``. Reads
``(dataset, indices)`` from ``IN.pkl``, seeds the global generators with ``SEED``,
computes ``[dataset[i] for i in indices]`` and writes ``("ok", results)``, or
``("load-error" | "getitem-error", traceback_text)``, to ``OUT.pkl``.
"""

from __future__ import annotations

import pickle
import random
import sys
import traceback


def main(argv: list[str]) -> int:
    """Run the child check; returns the exit status (0 even when the dataset fails)."""
    in_path, out_path, seed = argv[0], argv[1], int(argv[2])
    import numpy as np
    import torch

    # Different global state from the parent's: a dataset must not depend on it.
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - deliberately perturb the global state
    torch.manual_seed(seed)
    try:
        with open(in_path, "rb") as f:
            dataset, indices = pickle.load(f)
    except Exception:  # noqa: BLE001 - report any failure to the parent
        result: tuple = ("load-error", traceback.format_exc())
    else:
        try:
            result = ("ok", [dataset[i] for i in indices])
        except Exception:  # noqa: BLE001
            result = ("getitem-error", traceback.format_exc())
    try:
        payload = pickle.dumps(result)
    except Exception:  # noqa: BLE001 - e.g. a sample holding a lambda
        payload = pickle.dumps(("getitem-error", traceback.format_exc()))
    with open(out_path, "wb") as f:
        f.write(payload)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
