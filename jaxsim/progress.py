"""Progress of long runs where no terminal shows a bar (piped output, CI logs): one plain line on stderr
at most every ``interval_s`` seconds (default 10 s), e.g. ``sweep: 40,960 / 102,400 configs (40 %), 12 s``.

``jaxsim sweep`` and ``jaxsim replay`` draw a rich progress bar on a terminal and use :class:`ProgressLines`
otherwise; ``--quiet`` / ``--no-progress`` turn both off.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["ProgressLines", "PROGRESS_INTERVAL_S"]

PROGRESS_INTERVAL_S = 10.0


class ProgressLines:
    """Counts work done towards ``total`` and prints ``<what>: done / total <unit> (pct %), elapsed`` on
    ``stream`` when ``interval_s`` has passed since the start or the last line (never more often); with
    ``unit="%"`` (``total`` 100), ``<what>: pct %, elapsed``."""

    def __init__(self, what: str, total: int, unit: str, *, done: int = 0, interval_s: float | None = None,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        self.what, self.total, self.unit, self.done = what, int(total), unit, int(done)
        self.interval_s = float(PROGRESS_INTERVAL_S if interval_s is None else interval_s)
        self.stream = stream
        self.clock = clock
        self.start = self.last = clock()
        self.lines = 0

    def advance(self, k: int, note: str = "") -> None:
        """``k`` more units done; print a line if the interval has passed."""
        self.done += int(k)
        now = self.clock()
        if now - self.last >= self.interval_s:
            self.last = now
            self._print(now, note)

    def set(self, done: int, note: str = "") -> None:
        """``done`` units done so far (absolute); print a line if the interval has passed."""
        self.advance(int(done) - self.done, note)

    def _print(self, now: float, note: str) -> None:
        pct = f" ({100.0 * self.done / self.total:.0f} %)" if self.total > 0 else ""
        tail = f", {note}" if note else ""
        counts = f"{self.done:,} / {self.total:,} {self.unit}{pct}" if self.unit != "%" else f"{self.done} %"
        print(f"{self.what}: {counts}, {now - self.start:.0f} s{tail}", file=self.stream or sys.stderr, flush=True)
        self.lines += 1
