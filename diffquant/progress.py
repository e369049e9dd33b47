"""Progress bars that stay readable in log files.

On a terminal this is plain tqdm. Off a terminal (a training log, CI, `nohup … > log`) tqdm's redraws would pile up
as one endless line of carriage returns (a GPU training log reached 0.9 MB in 8 minutes): here each redraw becomes
its own line, at most one every ``LOG_INTERVAL`` seconds, and postfix updates never force one.
"""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

LOG_INTERVAL = 30.0  # seconds between two lines of a bar written to a file


class _OneLinePerRedraw:
    """A text stream wrapper that turns tqdm's carriage-return redraws into separate lines."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        text = text.replace("\r", "\n")
        while "\n\n" in text:
            text = text.replace("\n\n", "\n")
        text = text.lstrip("\n")  # each redraw ends its own line, so a log record never continues a bar's
        return self.stream.write(text if not text or text.endswith("\n") else text + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _on_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class progress_bar(tqdm):  # noqa: N801 - used exactly like tqdm
    """tqdm with log-friendly behaviour off a terminal; same arguments as tqdm."""

    def __init__(self, *args, **kwargs):
        stream = kwargs.get("file") or sys.stderr
        self._terminal = _on_terminal(stream)
        if not self._terminal:
            kwargs["file"] = _OneLinePerRedraw(stream)
            kwargs["mininterval"] = max(kwargs.get("mininterval") or 0.0, LOG_INTERVAL)
            kwargs["maxinterval"] = max(kwargs.get("maxinterval") or 0.0, 2 * LOG_INTERVAL)
            kwargs["dynamic_ncols"] = False
            kwargs.setdefault("ncols", 120)
        super().__init__(*args, **kwargs)

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
        super().set_postfix(ordered_dict, refresh=refresh and self._terminal, **kwargs)

    def set_postfix_str(self, s="", refresh=True):
        super().set_postfix_str(s, refresh=refresh and self._terminal)


def above_bars():
    """A context in which a line written to stderr (a log record) lands above the terminal's bars, not inside one."""
    return tqdm.external_write_mode(file=sys.stderr)
