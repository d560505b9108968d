"""``benchmarks/bench_gpu.py`` refuses the 1.34B model without CUDA, and its rows die with it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_bench_gpu_needs_cuda_unless_tiny(monkeypatch, capsys):
    import torch

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_gpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def no_row(*args, **kwargs):
        raise AssertionError("a row of the 1.34B model started without CUDA")

    monkeypatch.setattr(bench_gpu, "_row_in_subprocess", no_row)
    monkeypatch.setattr(sys, "argv", ["bench_gpu.py"])
    with pytest.raises(SystemExit) as exc:
        bench_gpu.main()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "run with --tiny" in err


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


PARENT = """
import sys, time
sys.path.insert(0, {benchmarks!r})
from child_processes import install_cleanup, run_child
install_cleanup()
child = "import os, time; open({pidfile!r}, 'w').write(str(os.getpid())); time.sleep(120)"
run_child([sys.executable, "-c", child], timeout=120)
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["timeout", "kill-9"])
def test_rows_die_with_the_benchmark(tmp_path, sig):
    pidfile = tmp_path / "child.pid"
    code = PARENT.format(benchmarks=str(BENCHMARKS), pidfile=str(pidfile))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    parent = subprocess.Popen([sys.executable, "-c", code], env=env)
    child = None
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.is_file() and pidfile.read_text()):
            assert parent.poll() is None and time.monotonic() < deadline, "no child started"
            time.sleep(0.05)
        child = int(pidfile.read_text())
        parent.send_signal(sig)  # what `timeout` (SIGTERM) or a scheduler (SIGKILL) does
        parent.wait(timeout=30)
        deadline = time.monotonic() + 20
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the row outlived the benchmark"
    finally:
        parent.kill()
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
