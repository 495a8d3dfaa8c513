"""One-line notices for waits a user would otherwise sit through in silence: a first
compile, a kernel build.

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
