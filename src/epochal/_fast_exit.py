"""End a finished command without the interpreter's teardown.

A process that has imported torch spends about a second after its last line in
Python's finalization (torch with ``torch._dynamo``, which every optimizer step imports:
about 1.5 s on a 2-core machine; 3,000 modules' objects destroyed one by one). Nothing a
finished command leaves needs it, and every process of a ``torchrun`` job pays it
before the launcher can return. :func:`exit_now` keeps what a normal exit does that
matters, in the same order, then ends the process with ``os._exit``:

1. waits for the threads that are not daemons (a normal exit waits for them too);
2. runs the ``atexit`` handlers (``logging.shutdown``, multiprocessing's clean-up of
   its children, ``weakref.finalize`` objects, the process group's destruction that
   :func:`~epochal.parallel.launch.init_distributed` registers, ...);
3. flushes every file object still open for writing (text layers before their
   buffers), standard output and standard error among them: a normal exit flushes
   them when it destroys what holds them.

The ``epochal`` console script and ``python -m epochal.cli`` end this way after a
command returns; an exception still ends the process the normal way (traceback, status
1), as does ``SystemExit`` (argument errors, ``--help``).
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import sys
import threading
from typing import NoReturn

__all__ = ["exit_now"]

#: the file objects that hold written data until they are flushed
_WRITERS = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)


def exit_now(status: int) -> NoReturn:
    """Finish as a normal exit would (module docstring), then end the process with ``status``.

    Args:
        status: the exit status, 0-255.
    """
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    files = [o for o in gc.get_objects() if type(o) in _WRITERS]
    files.sort(key=lambda f: type(f) is not io.TextIOWrapper)  # text layers before buffers
    for stream in [*files, sys.stdout, sys.stderr]:  # replaced std streams need not be io's
        try:
            if not getattr(stream, "closed", False):
                stream.flush()
        except (OSError, ValueError):  # a closed pipe, a detached layer: nothing to write
            pass
    os._exit(status)
