"""The progress line: what runs now and about how long is left.

A scenario announces its plan up front (a list of (label, estimated seconds), built by its
`plan()` function without starting anything), then wraps each piece of work in
`progress.step(label)`.  The time left is the estimates of the steps not yet begun plus what
remains of the current one, so the demo can tell a new user how long the whole thing takes
before the first cluster is up.  On a terminal the line is redrawn every second in place (on
stderr, so the tables on stdout stay clean); otherwise one line per step is printed.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from contextlib import contextmanager


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds >= 3600:
        return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
    return f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    def __init__(self, stream=None, quiet: bool = False):
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._plan: list[tuple[str, float]] = []
        self._done = 0
        self._total = 0
        self._current: tuple[str, float, float] | None = None  # label, estimate, start
        self._detail = ""
        self._shown = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self.started = time.monotonic()

    # planning ------------------------------------------------------------------------
    def add_plan(self, steps: list[tuple[str, float]]) -> None:
        with self._lock:
            self._plan.extend(steps)
            self._total += len(steps)

    def left_seconds(self) -> float:
        with self._lock:
            return self._left_locked()

    def _left_locked(self) -> float:
        left = sum(est for _, est in self._plan)
        if self._current is not None:
            _, est, start = self._current
            left += max(0.0, est - (time.monotonic() - start))
        return left

    # running --------------------------------------------------------------------------
    @contextmanager
    def step(self, label: str, estimate: float | None = None):
        """Run one planned step (matched by label; earlier planned steps that never ran,
        e.g. a peer that is not installed, are dropped from the estimate)."""
        with self._lock:
            est = estimate
            for i, (planned, planned_est) in enumerate(self._plan):
                if planned == label:
                    est = planned_est if estimate is None else estimate
                    self._total -= i  # skipped ones no longer count
                    del self._plan[:i + 1]
                    break
            else:
                self._total += 1
            self._current = (label, est or 0.0, time.monotonic())
            self._detail = ""
            self._done += 1
        self._draw(new_step=True)
        self._ensure_ticker()
        try:
            yield self
        finally:
            with self._lock:
                self._current = None
                self._detail = ""

    def detail(self, text: str) -> None:
        """A short note appended to the current step's line (e.g. 'probing 150 clients')."""
        with self._lock:
            self._detail = text
        self._draw()

    def note(self, message: str) -> None:
        """A message on a line of its own (the status line is redrawn below it)."""
        if self.quiet:
            return
        with self._lock:
            self._erase_locked()
            print(message, file=self.stream, flush=True)
        self._draw()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
        with self._lock:
            self._erase_locked()

    def clear(self) -> None:
        """Erase the status line before printing something else to the terminal."""
        with self._lock:
            self._erase_locked()

    # drawing --------------------------------------------------------------------------
    def _line_locked(self) -> str:
        if self._current is None:
            return ""
        label, est, start = self._current
        elapsed = time.monotonic() - start
        total = max(self._total, self._done)
        head = f"[{self._done:>2}/{total}] {label}"
        if self._detail:
            head += f" ({self._detail})"
        timing = fmt_duration(elapsed)
        if est:
            timing += f"/{fmt_duration(est)}"
        return f"{head}  {timing}  ~{fmt_duration(self._left_locked())} left"

    def _draw(self, new_step: bool = False) -> None:
        if self.quiet:
            return
        with self._lock:
            line = self._line_locked()
            if not line:
                return
            if self.tty:
                width = shutil.get_terminal_size((100, 20)).columns - 1
                self.stream.write("\r\x1b[K" + line[:width])
                self.stream.flush()
                self._shown = True
            elif new_step:
                print(line, file=self.stream, flush=True)

    def _erase_locked(self) -> None:
        if self.tty and self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False

    def _ensure_ticker(self) -> None:
        if not self.tty or self.quiet or self._ticker is not None:
            return

        def tick():
            while not self._stop.wait(1.0):
                self._draw()
        self._ticker = threading.Thread(target=tick, name="lab-progress", daemon=True)
        self._ticker.start()
