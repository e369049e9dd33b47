"""Data parallelism on ``torch.distributed``: shard the work, merge the results exactly on rank 0.

``torchrun --nproc-per-node N -m diffquant profile|sweep …`` (or ``accelerate launch``) starts N copies; the
command line calls :func:`session`, which joins the process group the launcher describes (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``): NCCL with one GPU per process
(``cuda:LOCAL_RANK``) where CUDA exists, gloo on CPU (``DIFFQUANT_DIST_BACKEND`` overrides). Without a process
group every helper here is the single-process identity, so the library runs one code path.

Inside a process group the measuring functions (``profile``, ``score_requests`` and what calls it) are
*collective*: every rank must call them with the same arguments. Each rank computes its share
(:func:`block` for streams whose order matters, :func:`strided` for independent batches), and
:func:`reduce_on_main` sends the shares to rank 0, which merges them in rank order and hands the result to
every rank. A rank that fails still reaches the collective, so the whole run fails with the first failure's
one line instead of hanging, and nothing is written from partial results. Before any of it, :func:`agree`
refuses a launch whose ranks were given different arguments.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import TypeVar

import torch

from .errors import UserError, first_line

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
INPUT_ERRORS = (UserError, ValueError, OSError)


class RankFailed(RuntimeError):
    """Another rank (or the merge on rank 0) failed with an unexpected error; the message names the rank."""


class RankInputError(UserError):
    """A rank refused its input (a UserError, ValueError or OSError there); the message names the rank."""


class RanksDisagree(RankInputError):
    """The ranks of a launch were given different arguments; the message names the first and the ranks."""


# ---------------------------------------------------------------------------------------------------- the group

def _dist():
    return torch.distributed


def is_distributed() -> bool:
    """True inside an initialised process group of more than one process."""
    d = _dist()
    return d.is_available() and d.is_initialized() and d.get_world_size() > 1


def rank() -> int:
    return _dist().get_rank() if is_distributed() else 0


def world_size() -> int:
    return _dist().get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return rank() == 0


def launch_rank() -> int:
    """This process's rank as the launcher set it (0 outside a launch), also before and after the group."""
    return int(os.environ.get("RANK", "0"))


def launched() -> bool:
    """The environment of a multi-process launch (torchrun, accelerate launch)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def backend() -> str:
    return os.environ.get("DIFFQUANT_DIST_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")


def local_device(device: str | torch.device | None = None) -> torch.device:
    """The device of this rank: ``cuda`` means ``cuda:LOCAL_RANK`` in a process group, else unchanged."""
    device = torch.device(device or ("cuda" if is_distributed() and backend() == "nccl" else "cpu"))
    if device.type == "cuda" and device.index is None and is_distributed():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def init() -> bool:
    """Join the launcher's process group (idempotent); False when this is not a multi-process launch."""
    d = _dist()
    if not launched() or not d.is_available():
        return False
    if not d.is_initialized():
        name = backend()
        if name == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        d.init_process_group(backend=name)
        log.debug("rank %d of %d joined (%s)", d.get_rank(), d.get_world_size(), name)
    if d.get_rank() != 0:  # library logging from rank 0 only
        logging.getLogger("diffquant").setLevel(logging.CRITICAL + 1)
    return True


def finish() -> None:
    d = _dist()
    if d.is_available() and d.is_initialized():
        d.destroy_process_group()


@contextmanager
def session():
    """A command's lifetime in a launch: join the group, silence stdout on ranks > 0, leave the group."""
    if not init():
        yield
        return
    try:
        if is_main():
            yield
        else:
            with open(os.devnull, "w") as null:
                saved, sys.stdout = sys.stdout, null
                try:
                    yield
                finally:
                    sys.stdout = saved
        # on success, no rank tears gloo down while a peer is still inside a collective (a rare SIGABRT in its
        # C++ teardown); after a failure the peers may not reach a barrier, so leave at once
        _dist().barrier()
    finally:
        finish()


def agree(values: dict[str, str]) -> None:
    """Refuse, on every rank alike, a launch whose ranks hold different ``values`` (name -> value as text: the
    arguments every rank must share). Ranks that disagree would shard different work and fail later in a merge
    (an IndexError) or hang; here the first differing name and who holds what make one line. Gathered over
    gloo (a gloo group beside an NCCL one), so it needs no device."""
    if not is_distributed():
        return
    d = _dist()
    group = None if d.get_backend() == "gloo" else d.new_group(backend="gloo")
    gathered: list[dict[str, str] | None] = [None] * world_size()
    _collective(lambda: d.all_gather_object(gathered, values, group=group))
    for name in dict.fromkeys(k for ranked in gathered for k in ranked):
        held: dict[str | None, list[int]] = {}
        for r, ranked in enumerate(gathered):
            held.setdefault(ranked.get(name), []).append(r)
        if len(held) > 1:
            who = "; ".join(f"{_ranks(rs)}: {'(not given)' if v is None else v}" for v, rs in held.items())
            raise RanksDisagree(f"the ranks of this launch were given different {name} ({who}); every rank "
                                "must run the same command")


def _collective(call: Callable[[], T]) -> T:
    """``call()``, a collective; a peer that failed on its own and left (gloo: "Connection closed by peer") is
    one line pointing at that rank's own line, not the transport's message."""
    try:
        return call()
    except RuntimeError as exc:  # -v shows the transport's traceback
        raise RankFailed("another rank left the launch during a collective; its own error line says why") from exc


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


# ---------------------------------------------------------------------------------------------------- sharding

def block(items: Sequence[T]) -> tuple[int, Sequence[T]]:
    """(index of the first, the items) of this rank's contiguous share: rank r takes the r-th of ``world``
    nearly equal runs, so shares concatenated in rank order are the original order."""
    n, r, w = len(items), rank(), world_size()
    start, stop = n * r // w, n * (r + 1) // w
    return start, items[start:stop]


def strided(n: int) -> range:
    """Indices ``rank, rank + world, …`` of ``range(n)``: a balanced share when items differ in cost."""
    return range(rank(), n, world_size())


# ---------------------------------------------------------------------------------------------------- collectives

def _attempt(fn: Callable[[], T]) -> tuple[T | None, tuple[str, str] | None]:
    try:
        return fn(), None
    except INPUT_ERRORS as exc:
        return None, ("input", f"{type(exc).__name__}: {first_line(exc)}")
    except Exception as exc:  # noqa: BLE001 - carried to every rank, raised there as one line
        return None, ("internal", f"{type(exc).__name__}: {first_line(exc)}")


def _raise(where: int, error: tuple[str, str]) -> None:
    kind, message = error
    raise (RankInputError if kind == "input" else RankFailed)(f"rank {where}: {message}")


def reduce_on_main(local: Callable[[], T], merge: Callable[[list[T]], R]) -> R:
    """``merge([share of rank 0, share of rank 1, …])`` computed on rank 0 and returned on every rank.

    Single process: ``merge([local()])``, errors raised as they are. In a group every rank runs ``local``
    (a failure is caught, so every rank still reaches the collectives), rank 0 gathers the shares, merges them
    and broadcasts the result; if any rank failed, every rank raises the first failure as one line.
    """
    if not is_distributed():
        return merge([local()])
    d = _dist()
    share = _attempt(local)
    shares = [None] * world_size() if is_main() else None
    _collective(lambda: d.gather_object(share, shares, dst=0))
    if is_main():
        failed = [(r, err) for r, (_, err) in enumerate(shares) if err is not None]
        if failed:
            payload = (None, failed[0])
        else:
            result, err = _attempt(lambda: merge([s for s, _ in shares]))
            payload = (result, None if err is None else (0, err))
    box = [payload if is_main() else None]
    _collective(lambda: d.broadcast_object_list(box, src=0))
    result, failure = box[0]
    if failure is not None:
        _raise(*failure)
    return result


def on_main(fn: Callable[[], R]) -> R:
    """``fn()`` run on rank 0 only, its result (or its failure) on every rank."""
    return reduce_on_main(lambda: None, lambda _: fn())
