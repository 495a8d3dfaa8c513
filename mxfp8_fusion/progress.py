"""One-line notices for waits a user would otherwise sit through in silence (a first
compile, a kernel build), and the progress bar of a long one (a warm-up).

Where the application configured logging (a handler on the root logger, or a level set on
the ``mxfp8_fusion`` logger), a notice is an INFO record on the ``mxfp8_fusion`` logger and
logging decides whether it shows. Where nothing configured logging (a script, a notebook), it
is printed to stderr, since Python would drop an INFO record there.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("mxfp8_fusion")

_said: set[str] = set()


def notice(message: str, once: str | None = None) -> None:
    """Tell the user ``message``; with ``once``, only the first time for that key."""
    if once is not None:
        if once in _said:
            return
        _said.add(once)
    if log.level != logging.NOTSET or logging.getLogger().handlers:
        log.info(message)
    else:
        print(f"mxfp8_fusion: {message}", file=sys.stderr, flush=True)


class Bar:
    """A progress bar on stderr for ``total`` steps: redrawn in place on a terminal, else
    one line when done (a log file gets no control characters). ``enabled=False`` shows
    nothing."""

    def __init__(self, label: str, total: int, enabled: bool = True) -> None:
        self.label, self.total, self.done = label, total, 0
        self.enabled = enabled and total > 0
        self.tty = self.enabled and sys.stderr.isatty()
        self._draw()

    def advance(self) -> None:
        """One more step done."""
        self.done += 1
        self._draw()

    def _draw(self) -> None:
        if self.tty:
            filled = 30 * self.done // max(self.total, 1)
            bar = "#" * filled + "." * (30 - filled)
            print(f"\r{self.label} [{bar}] {self.done}/{self.total}", end="", file=sys.stderr)
            sys.stderr.flush()

    def close(self) -> None:
        """Finish the bar's line."""
        if self.tty:
            print(file=sys.stderr, flush=True)
        elif self.enabled:
            notice(f"{self.label}: {self.done}/{self.total} done")
