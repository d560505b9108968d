"""``exit_now`` ends a process with what a normal exit keeps: threads, atexit, open files, output."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from pathlib import Path
    from epochal._fast_exit import exit_now

    out = Path(sys.argv[1])
    atexit.register(lambda: (out / "atexit").write_text("ran"))

    def late():
        time.sleep(0.3)
        (out / "thread").write_text("joined")

    threading.Thread(target=late).start()

    kept = open(out / "text", "w")  # open files a normal exit would flush at teardown
    kept.write("text flushed")
    raw = open(out / "bytes", "wb")
    raw.write(b"bytes flushed")
    sys.stdout.write("no newline at the end")  # a pipe: block-buffered
    exit_now(3)
    """
)


def test_exit_now_keeps_threads_finalizers_atexit_and_output(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "no newline at the end"
    assert (tmp_path / "thread").read_text() == "joined"
    assert (tmp_path / "text").read_text() == "text flushed"
    assert (tmp_path / "bytes").read_bytes() == b"bytes flushed"
    assert (tmp_path / "atexit").read_text() == "ran"
