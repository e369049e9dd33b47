"""The expected time of long work, said before it runs: the work's size × the rate measured on its first batch.

The line goes to the ``diffquant.eta`` logger at INFO, which the command line shows without ``-v``. Work expected to
take less than :data:`MIN_SECONDS` gets no line. The first batch carries one-time costs (eager switches, caches),
so the estimate errs long.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .progress import above_bars

log = logging.getLogger(__name__)

MIN_SECONDS = 30.0  # shorter work is not announced


def duration(seconds: float) -> str:
    """``seconds`` as people read it: "45 s", "3 min 20 s", "2 h 05 min"."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class FirstBatchEstimate:
    """Times the first batch of ``total`` units of work and logs the expected time of all of them.

    ``what`` names the work ("profile T", "perplexity"); ``sync`` (e.g. ``torch.cuda.synchronize``) waits for
    queued device work so the first batch is timed whole.
    """

    def __init__(self, what: str, total: int, unit: str = "tokens", sync: Callable[[], None] | None = None,
                 enabled: bool = True):
        self.what, self.total, self.unit, self.sync = what, total, unit, sync
        self.pending = enabled
        self.start = time.perf_counter()
        self.seconds: float | None = None  # the expected total, once measured

    def batch_done(self, units: int) -> None:
        """Call after every batch with its size; the first call measures and announces, later ones do nothing."""
        if not self.pending:
            return
        self.pending = False
        if self.sync is not None:
            self.sync()
        elapsed = time.perf_counter() - self.start
        self.seconds = elapsed * self.total / max(units, 1)
        if self.seconds >= MIN_SECONDS:
            with above_bars():
                log.info("%s: about %s expected for %s %s (the first %s took %s)", self.what, duration(self.seconds),
                         f"{self.total:,}", self.unit, f"{units:,}", duration(elapsed))
