"""The ``diffquant`` command line.

Each sub-command lives in ``diffquant/commands/<name>.py`` with a ``register(subparsers)`` function; they
are discovered automatically. Arguments are checked where they enter (:mod:`diffquant.cliargs`), no output may
be written over, into or around an input, and every error is one line on stderr: exit 2 for bad input (a
:class:`~diffquant.errors.UserError`, raised at the boundaries: loading, parsing, devices), exit 1 with a hint to
rerun with ``-v`` for anything unexpected. ``-v`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from . import commands, distributed
from .cliargs import check_numbers, launch_arguments, path_roles
from .errors import UserError, first_line
from .io import check_outputs, refuse_overlap

log = logging.getLogger("diffquant")

EXIT_USAGE = 2  # bad input: a one-line message on stderr, never a traceback
EXIT_INTERNAL = 1  # a bug: one line and the hint to rerun with -v
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a Unix tool whose reader closed the pipe
# Our error, plus what the library raises for bad values (ValueError) and the file system for paths (OSError).
INPUT_ERRORS = (UserError, ValueError, OSError)


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line usage errors: ``diffquant: error: argument --tokens: must be ...``."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"diffquant: error: {message.splitlines()[0]} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="diffquant",
        description="Profile activation outliers, quantize checkpoints and print degradation tables "
                    "for Differential Transformers and matched Transformers.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details; show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"{commands.__name__}.{info.name}").register(sub)
    check_numbers(parser)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, except that a command's optional trailing positional (``trailing_positional`` in its defaults,
    e.g. convert's OUT) may follow its options: argparse fills an optional positional before the options it sees
    after it (``convert CKPT --to hf OUT`` would leave OUT unrecognised)."""
    args, extra = parser.parse_known_args(argv)
    name = getattr(args, "trailing_positional", None)
    if name and len(extra) == 1 and not extra[0].startswith("-") and getattr(args, name) is None:
        setattr(args, name, extra[0])
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = _parse(parser, argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error (or the help)
        return int(exc.code or 0)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("diffquant.eta").setLevel(logging.INFO)  # the expected time of long work, always shown
    if args.command is None:
        parser.print_help()
        return 0
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        inputs, outputs = path_roles(args)
        refuse_overlap(inputs, outputs)
        check_outputs(outputs)
        with distributed.session():  # torchrun / accelerate launch: join the process group
            distributed.agree(launch_arguments(parser, args))  # every rank runs the same command
            return args.func(args)
    except BrokenPipeError:  # `diffquant info X | head`: the reader left; stop quietly, as Unix tools do
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except INPUT_ERRORS as exc:
        if args.verbose:
            raise
        _say_once(exc, f"diffquant: error: {first_line(exc)}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _say_once(None, "diffquant: interrupted")
        return 130
    except Exception as exc:  # the last resort: one line, never a traceback unless asked
        if args.verbose:
            raise
        _say_once(exc, f"diffquant: internal error: {type(exc).__name__}: {first_line(exc)} (rerun with -v for the "
                       "traceback)")
        return EXIT_INTERNAL


def _say_once(exc: BaseException | None, line: str) -> None:
    """One line per launch, not per rank: rank 0 says it, and another rank only a failure of its own (every
    rank raises the collective ones, which name the rank, alike), prefixed with its rank."""
    if distributed.launch_rank() == 0:
        _say(line)
    elif exc is not None and not isinstance(exc, (distributed.RankInputError, distributed.RankFailed)):
        _say(f"diffquant: rank {distributed.launch_rank()}: {line.removeprefix('diffquant: ')}")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's flush at exit does not hit the closed pipe again."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _say(line: str) -> None:
    print(line, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
