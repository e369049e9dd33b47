"""Progress bars off a terminal: one line per redraw, at most one every LOG_INTERVAL seconds."""

import io

from diffquant import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(stream, steps: int = 500) -> str:
    with progress.progress_bar(total=steps, desc="train", file=stream, mininterval=0) as bar:
        for i in range(steps):
            bar.update(1)
            bar.set_postfix(loss=1.0 / (i + 1))  # tqdm's default would redraw on every postfix
    return stream.getvalue()


def test_a_log_file_gets_few_separate_lines():
    text = run(io.StringIO())
    lines = [line for line in text.splitlines() if line]
    assert "\r" not in text
    assert 1 <= len(lines) <= 3, lines  # the first draw, the final one (a fast loop is far inside 30 s)
    assert "500/500" in lines[-1]


def test_a_terminal_keeps_tqdm_redraws():
    text = run(Terminal())
    assert text.count("\r") > 100  # every postfix update redraws, as tqdm does


def test_a_log_file_gets_one_line_per_interval():
    now = [1000.0]
    stream = io.StringIO()
    with progress.progress_bar(total=60, file=stream) as bar:
        bar._time = lambda: now[0]  # a clock the test drives: 10 s per step, 600 s in all
        bar.start_t = bar.last_print_t = now[0]
        for _ in range(60):
            now[0] += 10.0
            bar.update(1)
    lines = [line for line in stream.getvalue().splitlines() if line]
    assert 600 / progress.LOG_INTERVAL - 2 <= len(lines) <= 600 / progress.LOG_INTERVAL + 3, lines
