"""The ``diffquant`` command line.

Each sub-command lives in ``diffquant/commands/<name>.py`` with a ``register(subparsers)`` function; they
are discovered automatically. Errors caused by input become one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from . import commands
from .errors import UserError

log = logging.getLogger("diffquant")

EXIT_USAGE = 2  # bad input: a one-line message on stderr, never a traceback


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffquant",
        description="Profile activation outliers, quantize checkpoints and print degradation tables "
                    "for Differential Transformers and matched Transformers.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details; show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"{commands.__name__}.{info.name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return int(exc.code or 0)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except (UserError, ValueError, FileNotFoundError, FileExistsError, RuntimeError, OSError) as exc:
        if args.verbose:
            raise
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"diffquant: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("diffquant: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
