"""``python -m epochal.data.proteins.examples [FOLDER]``: copy the shipped protein files into FOLDER."""

from __future__ import annotations

import sys

from epochal.data.proteins.examples import copy_examples


def main(argv: list[str] | None = None) -> int:
    """Copy the files into the folder given (default: the current one); 0, or 1 on a conflict."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or (args and args[0].startswith("-")):
        print("usage: python -m epochal.data.proteins.examples [FOLDER]", file=sys.stderr)
        return 2
    try:
        paths = copy_examples(args[0] if args else ".")
    except (FileExistsError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
