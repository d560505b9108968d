"""The ``epochal`` subcommands, one thin module each (see :mod:`epochal.cli`).

Each module defines ``add_arguments(parser)`` and ``run(args) -> int``: it parses, calls the
library layers (``epochal.data``, ``epochal.train``, ``epochal.convert``) and prints.
"""
