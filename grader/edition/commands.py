"""``python -m grader release DIR``: write the student edition. The edition ships this module
without grader/edition/release.py, so there the command says it has nothing to release from."""
from __future__ import annotations

import sys


def register(subparsers) -> None:
    """Add ``release`` to ``python -m grader``."""
    p = subparsers.add_parser("release", help="write the student edition (no solutions, public cases only) to DIR")
    p.add_argument("dest", metavar="DIR", help="a new or empty folder (or an earlier edition, with --force)")
    p.add_argument("--force", action="store_true", help="replace DIR when it holds an earlier student edition")
    p.add_argument("--through", metavar="LAB", default=None,
                   help="ship the labs up to and including LAB (course order), for a class that releases one lab "
                        "at a time; later labs' notebooks, lectures and checks stay out (default: every lab)")
    p.set_defaults(func=_cmd_release)


def _cmd_release(args) -> int:
    try:
        from .release import ReleaseError, build_release
    except ImportError:                 # the edition ships this module alone
        print("error: this is the student edition; it has no solutions to release from", file=sys.stderr)
        return 2
    try:
        build_release(args.dest, force=args.force, through=args.through)
    except ReleaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
