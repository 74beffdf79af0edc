"""Progress of a long data step: on a terminal one line redrawn in place (files, rate, MB/s, time
left); elsewhere (a log, a pipe, Slurm's output file) a plain line now and then."""
from __future__ import annotations

import sys
import time


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


class Progress:
    """``update(done, nbytes)`` as work goes on, ``close()`` at the end; ``total`` files in all
    (the step that lists them may set it)."""

    def __init__(self, what: str, total: int = 1, stream=None, every: float | None = None):
        self.what, self.total = what, max(1, total)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = every if every is not None else (0.25 if self.tty else 15.0)
        self.start = self._last = time.monotonic()
        self._done, self._bytes, self._drawn = 0, 0, False

    def text(self, done: int, nbytes: int, now: float) -> str:
        elapsed = max(now - self.start, 1e-6)
        rate = done / elapsed
        left = f", {_duration((self.total - done) / rate)} left" if 0 < done < self.total else ""
        return (f"{self.what}: {done}/{self.total} files ({100 * done / self.total:.1f}%), {rate:.0f} files/s, "
                f"{nbytes / elapsed / 1e6:.1f} MB/s{left}")

    def update(self, done: int, nbytes: int) -> None:
        self._done, self._bytes = done, nbytes
        now = time.monotonic()
        if now - self._last < self.every:
            return
        self._last = now
        self._draw(self.text(done, nbytes, now))

    def _draw(self, line: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + line)
            self._drawn = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """The last state, once (on a terminal the line is ended)."""
        if self.tty or self._done:
            self._draw(self.text(self._done, self._bytes, time.monotonic()))
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
