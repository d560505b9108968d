"""``training.eval_callback`` of the command-line kill test (tests/train/test_sft_cli_resume.py).

With ``SFT_PAUSE_RUN_DIR`` set in its environment, a run stops at its first
evaluation after a checkpoint is complete (``checkpoints/latest`` exists): it writes
``<SFT_PAUSE_RUN_DIR>.paused`` and sleeps, so the test kills it at a known point.
Without the variable it observes nothing and returns nothing, so the run's records
are those of a run without the callback.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def pause_after_checkpoint(batch: Any, logits: Any) -> None:
    """Sleep (after writing the marker) once the paused run has a complete checkpoint."""
    run = os.environ.get("SFT_PAUSE_RUN_DIR")
    if run and (Path(run) / "checkpoints" / "latest").is_file():
        Path(f"{run}.paused").write_text("")
        time.sleep(600)
