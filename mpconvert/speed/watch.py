"""A child process that reports progress as JSON lines, watched against deadlines and stopped past them.

A broken 16-bit kernel can take longer than any budget in one call: on an
Intel Xeon with AMX and avx512_fp16, `mpconvert doctor` spent 77 s on one
float16 batch of 256 rows of a Dense(4096)x2 model and ran to 158 s against
its 60 s budget. A call inside our own process cannot be stopped; a child
process can. `watch` runs one, hands each JSON line it prints to the caller
as it comes, and kills it when the next line is later than the caller's
deadline for it.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Stopped:
    """The child was killed: the next line was not there by its deadline."""

    waited_s: float


def watch(module: str, args: list[str], env: dict[str, str], deadline: Callable[[], float]) -> Iterator[dict | Stopped]:
    """Each JSON line the child `python -m module args` prints, then Stopped if it was killed.

    `deadline()` is asked before each line: the perf_counter time by which
    that line must arrive. A child that exits ends the iteration.
    """
    child = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert child.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(child.stdout, selectors.EVENT_READ)
    buffer = b""
    try:
        while True:
            due = deadline()
            started = time.perf_counter()
            line = None
            while line is None:
                if b"\n" in buffer:
                    raw, buffer = buffer.split(b"\n", 1)
                    line = raw
                    break
                left = due - time.perf_counter()
                if left <= 0 or not selector.select(timeout=left):
                    yield Stopped(round(time.perf_counter() - started, 2))
                    return
                chunk = os.read(child.stdout.fileno(), 65536)
                if not chunk:  # the child exited
                    return
                buffer += chunk
            try:
                parsed = json.loads(line)
            except ValueError:
                continue  # not ours (a library printing to stdout)
            if isinstance(parsed, dict):
                yield parsed
    finally:
        selector.close()
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stdout.close()
