"""Offline stand-ins for the Hub, loaded by every Python process this folder is on the path of.

The example-script tests put ``tests/accelerate/examples/shim`` first on ``PYTHONPATH``
with ``EPOCHAL_EXAMPLE_STAND_INS=1``: once ``transformers`` or ``datasets`` is
imported, :mod:`stand_ins` replaces ``from_pretrained`` and ``load_dataset`` with
offline equivalents (tiny random models, an offline tokenizer, small in-memory
datasets). Nothing happens without the variable.
"""

import os
import sys

if os.environ.get("EPOCHAL_EXAMPLE_STAND_INS") == "1":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import stand_ins

    stand_ins.install()
