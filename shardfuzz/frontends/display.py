"""How a campaign shows its progress: a live display on a terminal, plain lines elsewhere.

On a terminal, and without ``--no-progress``, :class:`LiveDisplay` redraws a few lines in place:
examples, rate, failing examples, distinct findings so far, elapsed and remaining time, and the
trigger conditions reached as short bars. It is drawn with rich: cursor movement, the terminal's
width, colour and ``NO_COLOR`` are a well-kept library's business, not hand-written escape codes
(rich: widely used, pure Python, and honours ``NO_COLOR`` itself). Off a terminal, on one that
cannot redraw (``TERM=dumb``: a pipe, a CI log, an editor's shell) or with ``--no-progress``, :class:`PlainDisplay` prints one line every
``--progress-every`` seconds (:func:`progress_line`), which a log keeps readable.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

#: the width of a trigger's bar in the live display, in cells
BAR_CELLS = 10
#: redraws a second of the live display
LIVE_REFRESH_PER_S = 4.0


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where one fuzzing campaign stands (what both displays draw)."""

    label: str  # target/implementation
    examples: int
    failing: int  # failing examples, shrinking included
    findings: int  # distinct findings kept so far (one per signature)
    elapsed: float  # seconds
    remaining: float | None  # seconds left: to the deadline, or the examples left at the current rate
    triggers: tuple[tuple[str, int], ...]  # each condition shown and the examples that reached it
    hangs: int = 0  # failing examples that hung, each after its timeout
    #: the example timeout adapts (no ``--timeout``): a hang's shrink waits 10 s an example where the
    #: target has no passes to learn from yet, and four new users waited minutes for one
    adaptive_timeout: bool = False

    @property
    def failing_words(self) -> str:
        """ "3 failing", and how many hung: a shrink of a hang runs at one example per timeout, and a
        new user took 0.1 examples/s for the tool itself stuck."""
        if not self.hangs:
            return f"{self.failing} failing"
        faster = "; a fixed --timeout of a few seconds shortens each" if self.adaptive_timeout else ""
        return f"{self.failing} failing ({self.hangs} hung, each after its timeout: shrinking a hang is slow{faster})"

    @property
    def rate(self) -> float:
        return self.examples / self.elapsed if self.elapsed > 0 else 0.0


#: what a progress line says before the first example has its verdict
FIRST_EXAMPLE = "no example finished yet (the ranks start, then the covering rows run first)"


def progress_line(p: Progress) -> str:
    """The plain line: elapsed, label, examples and rate, failing, then every condition's share."""
    n = p.examples
    if not n and not p.failing:  # "0 examples (0.0/s)" for the first seconds read as a stall
        return f"[{p.elapsed:6.1f}s] {p.label}: {FIRST_EXAMPLE}"
    share = ", ".join(f"{t} {100.0 * hits / n:.0f}%" for t, hits in p.triggers) if n else ""
    return f"[{p.elapsed:6.1f}s] {p.label}: {n} examples ({p.rate:.1f}/s), {p.failing_words}" + (
        f"; {share}" if share else ""
    )


class PlainDisplay:
    """One :func:`progress_line` every ``interval`` seconds, from a thread, until :meth:`stop`."""

    def __init__(self, stream: TextIO, interval: float) -> None:
        self.stream, self.interval = stream, interval
        self._stop = threading.Event()

    def start(self, progress: Callable[[], Progress]) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                print(progress_line(progress()), file=self.stream, flush=True)

        threading.Thread(target=loop, name="shardfuzz-progress", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def final(self, progress: Progress, note: str = "") -> None:
        print(progress_line(progress) + note, file=self.stream, flush=True)


class LiveDisplay:
    """The few lines of :func:`live_lines`, redrawn in place by ``rich.live.Live`` while the
    campaign runs; what else is printed meanwhile (a finding's report) scrolls above them."""

    def __init__(self, stream: TextIO) -> None:
        self.console = Console(file=stream, highlight=False)
        self._live: Any = None

    def start(self, progress: Callable[[], Progress]) -> None:
        self._live = Live(
            console=self.console,
            get_renderable=lambda: live_lines(progress(), self.console.width),
            refresh_per_second=LIVE_REFRESH_PER_S,
            transient=True,  # the final line replaces it, so a scrolled-back terminal reads like a log
            redirect_stderr=False,  # stderr may be another file (2>err.log): what goes there stays there
        )
        self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def final(self, progress: Progress, note: str = "") -> None:
        line = Text(progress_line(progress) + note)
        line.stylize(verdict_style(progress), 0, len(line))
        self.console.print(line)


def verdict_style(p: Progress) -> str:
    """Red once something failed, green while nothing has."""
    return "bold red" if p.failing or p.findings else "green"


def live_lines(p: Progress, width: int = 120) -> Any:
    """The live display: a status line, the time line, then a bar for each condition shown, as many
    to a row as ``width`` columns hold (up to 3)."""
    if not p.examples and not p.failing:
        status = Text(f"{p.label}: {FIRST_EXAMPLE}")
    else:
        status = Text(f"{p.label}: {p.examples} examples ({p.rate:.1f}/s), ")
        status.append(f"{p.failing_words}, {p.findings} distinct findings", style=verdict_style(p))
    left = f", about {p.remaining:.0f} s left" if p.remaining is not None else ""
    clock = Text(f"{p.elapsed:.0f} s elapsed{left}", style="dim")
    bars = Table.grid(padding=(0, 1))
    widest = max((len(name) for name, _ in p.triggers), default=0) + BAR_CELLS + 7  # name, bar, " 100%"
    columns = max(1, min(3, width // widest))
    for _ in range(columns):
        bars.add_column(no_wrap=True)
        bars.add_column(no_wrap=True)
    cells: list[Any] = []
    for name, hits in p.triggers:
        share = hits / p.examples if p.examples else 0.0
        full = round(share * BAR_CELLS)
        bar = Text("█" * full, style="cyan")
        bar.append("·" * (BAR_CELLS - full), style="dim")
        bar.append(f" {100 * share:3.0f}%")
        cells += [Text(name), bar]
    for i in range(0, len(cells), 2 * columns):
        row = cells[i : i + 2 * columns]
        bars.add_row(*row, *([Text("")] * (2 * columns - len(row))))
    return Group(status, clock, bars)


def print_summary(table: str, live: bool, stream: TextIO | None = None) -> None:
    """The campaign's summary table after a blank line; on a terminal (``live``) its verdicts in
    colour: what was found in red, a clean result in green (none with ``NO_COLOR``)."""
    out = stream if stream is not None else sys.stdout
    if not (live and out.isatty()):
        print("\n" + table, file=out, flush=True)
        return
    text = Text("\n" + table)
    text.highlight_regex(r"FOUND [\w-]+", "bold red")
    text.highlight_regex(r"nothing found", "green")
    Console(file=out, highlight=False).print(text, soft_wrap=True)


def display_for(stream: TextIO, interval: float, live: bool) -> PlainDisplay | LiveDisplay:
    """The live display where ``live`` is asked for and ``stream`` is a terminal, else plain lines."""
    if live and Console(file=stream).is_interactive:  # not TERM=dumb, where Live draws nothing
        return LiveDisplay(stream)
    return PlainDisplay(stream, interval)
