"""Ctrl-C and SIGTERM stop a run at the next safe point, even when a library swallows the first raise.

Python raises KeyboardInterrupt wherever the main thread happens to be. A
library's bare `except:` (optional imports inside TensorFlow's import are
common) or a finalizer ("Exception ignored in ...") can swallow it, and the
run would go on and write its output. So the handlers also record the
signal, and `check()` raises again where the pipeline starts a stage and
before an output folder is put in place.
"""

from __future__ import annotations

import signal

_received: int | None = None


class Terminated(KeyboardInterrupt):
    """SIGTERM, unwinding like Ctrl-C; the shell convention is 128 + 15."""

    exit_code = 128 + signal.SIGTERM


def _raise(signum: int) -> None:
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def _handler(signum, frame) -> None:
    global _received
    _received = signum
    _raise(signum)


def install() -> None:
    """Ctrl-C and SIGTERM (CI timeouts, kill, a stopped batch) unwind the run, so staging folders go."""
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)


def check() -> None:
    """Raise again for a signal that arrived earlier (a no-op where `install` was not called)."""
    if _received is not None:
        _raise(_received)


def received() -> int | None:
    """The signal that arrived, if any: an error raised after it is its consequence, not a failure."""
    return _received


def forget() -> None:
    """Forget a recorded signal: for a process that handled it and goes on (the tests)."""
    global _received
    _received = None
