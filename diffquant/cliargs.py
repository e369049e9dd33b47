"""Command-line values are checked where they enter, by one rule for every sub-command.

:func:`check_numbers` rewrites the parser once it is built: every ``type=int`` option becomes a bounded integer
(positive; non-negative where 0 is the default, as in "0 = off", or the name is in :data:`NON_NEGATIVE`; at
most :data:`UPPER` or :data:`DEFAULT_UPPER`; bit widths keep the quantizer's own range checks), every
``type=float`` option a finite non-negative number, and every ``--device`` a device that exists here.

:func:`path_roles` names the input and output paths of a parsed command line (by the conventions in
:data:`INPUT_FLAGS` / :data:`OUTPUT_FLAGS`, or a command's own ``inputs`` / ``outputs`` defaults), so the CLI
can refuse an output over, inside or around an input for every sub-command in one place.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from .kinds import canonical_granularity

NON_NEGATIVE = frozenset({"seed", "warmup_steps"})  # 0 is meaningful though not the default
DOMAIN_CHECKED = frozenset({"bits", "act_bits", "logit_bits"})  # the quantizer's own range messages say more
DEFAULT_UPPER = 2**31 - 1
UPPER = {"n_boot": 100_000, "batch_size": 4096, "topk": 1_000_000, "threads": 1024, "seed": 2**32 - 1,
         "seq_len": 1 << 21, "calib_seq_len": 1 << 21, "chunk": 1 << 21,
         "calib_tokens": 1 << 24}  # calibration windows are allocated at once
INPUT_FLAGS = ("checkpoint", "checkpoints", "source", "records", "pair", "init_from", "branch_from", "tokenizer",
               "data", "calib_data", "tasks")
OUTPUT_FLAGS = ("out", "output", "json", "plot", "training_plot")


def act_granularity(text: str) -> str:
    """An activation granularity flag's value, the old name "tensor" read as "sequence"."""
    return canonical_granularity(text)


def bounded_int(dest: str, zero_ok: bool = False):
    low = 0 if zero_ok or dest in NON_NEGATIVE else 1
    high = UPPER.get(dest, DEFAULT_UPPER)

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer in {low}..{high}, got {value}")
        return value

    return parse


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite non-negative number, got {text!r}")
    return value


def device(text: str) -> str:
    """A torch device that exists on this machine (``cpu``, ``cuda``, ``cuda:N`` with N < the GPU count, ``mps``)."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}") from None
    if dev.type == "cuda" and not (torch.cuda.is_available() and (dev.index or 0) < torch.cuda.device_count()):
        raise argparse.ArgumentTypeError(f"{text} is not available here ({torch.cuda.device_count()} CUDA devices)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError("mps is not available here")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"unsupported device {text!r} (cpu, cuda[:N] or mps)")
    return text


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device`` of every command that runs a model (checked by :func:`device` once the parser is built)."""
    parser.add_argument("--device", default=None,
                        help="cpu, cuda[:N] or mps (default: cuda when available, else cpu)")


def chosen_device(args: argparse.Namespace) -> str:
    """The ``--device`` given, else cuda when available, else cpu."""
    import torch

    if getattr(args, "device", None):
        return args.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_numbers(parser: argparse.ArgumentParser) -> None:
    """Give every sub-command's int, float and device options the checked types above."""
    for action in _all_actions(parser):
        if action.type is int and action.dest not in DOMAIN_CHECKED:
            action.type = bounded_int(action.dest, zero_ok=action.default == 0)
        elif action.type is float:
            action.type = finite_float
        elif action.dest == "device" and action.type is None:
            action.type = device


def _all_actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _all_actions(sub)


def path_roles(args: argparse.Namespace) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(inputs, outputs): flag -> the paths given for it on this command line. An input value may also be a
    comma-separated list with ``TASK:PATH`` items (``sweep --tasks``): each part counts as a path."""
    def given(dests, prefix: str, expand) -> dict[str, list[str]]:
        found = {}
        for dest in dests:
            value = getattr(args, dest, None)
            if value:
                values = value if isinstance(value, list) else [value]
                found[prefix + dest.replace("_", "-")] = [p for v in values for p in expand(str(v))]
        return found

    inputs = given(getattr(args, "inputs", INPUT_FLAGS), "", _path_candidates)
    return inputs, given(getattr(args, "outputs", OUTPUT_FLAGS), "--", _with_companions)


RANK_OWN = frozenset({"verbose", "device", "threads"})  # what each rank of a launch may set for itself


def launch_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """The arguments every rank of a torchrun launch must share, by flag (``--tokens``) or positional name:
    the command and each of its arguments but the outputs (rank 0 alone writes) and :data:`RANK_OWN`."""
    own = RANK_OWN | set(getattr(args, "outputs", OUTPUT_FLAGS))
    out = {"the command": str(args.command)}
    for action in _command_actions(parser, args.command):
        if action.dest in own or action.dest in ("help", argparse.SUPPRESS) or not hasattr(args, action.dest):
            continue
        longs = [o for o in action.option_strings if o.startswith("--")]
        out[(longs or action.option_strings or [action.dest])[0]] = repr(getattr(args, action.dest))
    return out


def _command_actions(parser: argparse.ArgumentParser, command: str | None) -> list[argparse.Action]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]._actions
    return []


def hist_plot_path(plot: str) -> str:
    """The histogram figure written beside a ``--plot`` PNG (``x.png`` -> ``x-hist.png``)."""
    p = Path(plot)
    return str(p.with_name(p.stem + "-hist.png"))


def _with_companions(value: str) -> list[str]:
    """An output path and the files written beside it (a PNG's histogram figure)."""
    return [value, hist_plot_path(value)] if value.lower().endswith(".png") else [value]


def _path_candidates(value: str) -> list[str]:
    parts = [p.strip() for p in value.split(",") if p.strip()]
    return [value, *parts, *(p.partition(":")[2] for p in parts if ":" in p)]
