"""A runner with what `verify` measures of it: its calls timed where it runs, and the memory it grew by.

`Measured` wraps a runner in this process; `Isolated` (isolated.py) gives
the same three calls for a runner in a child process, where the child
wraps its runner in a `Measured` and answers with its figures. Both count
the same things, so an artifact's figures mean the same whichever process
ran it:

* `timed(inputs, timing)`: `timing` is given the runner's prepared call on
  `inputs` (`Runner.timer`) and times it where the model runs, so in a child
  the pipe to it is not in the figures.
* `memory()`: the peak resident memory (VmHWM) since just before the first
  run or timing, less the resident memory (VmRSS) then: the file loaded, its
  session(s) and every call's buffers, not the runtime library (import it
  before the first run) nor the inputs already in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

from mpconvert.runners.base import Runner, RunResult
from mpconvert.system.memory import peak_resident, reset_peak, resident

T = TypeVar("T")
# What times a prepared call: `speed.timing.timed_ms`'s calls of one callable, say; it must pickle (by
# reference: a module-level function, or a functools.partial of one) to be sent to a child.
Timing = Callable[[Callable[[], None]], T]


@dataclass(frozen=True)
class Growth:
    """A process's resident memory before a model's first run, and its peak since, in bytes."""

    before: int
    peak: int
    reset: bool  # False: the peak could not be reset (not Linux), so it may be from before the first run

    @property
    def bytes(self) -> int:
        return max(0, self.peak - self.before)


class MeasuredRunner(Protocol):
    """A runner whose calls can be timed where it runs and whose memory growth can be asked for."""

    @property
    def runtime(self) -> str: ...

    def run(self, inputs: Sequence[np.ndarray]) -> RunResult: ...

    def timed(self, inputs: Sequence[np.ndarray], timing: Timing[T], *, calls: int = 1) -> T:
        """`timing(call)` on the runner's prepared call on `inputs`; `calls`: how many it makes at least."""
        ...

    def memory(self) -> Growth | None:
        """The growth since the first run or timing; None before one, or where this OS does not tell."""
        ...

    def __enter__(self) -> MeasuredRunner: ...

    def __exit__(self, *exc: object) -> None:
        """Ends what runs the model (a child process); the runner's own resources are the runner's."""


@dataclass
class Measured:
    """`runner` in this process, measured from its first run or timing on."""

    runner: Runner
    _before: int | None = field(default=None, repr=False)
    _reset: bool = field(default=False, repr=False)
    _started: bool = field(default=False, repr=False)

    @property
    def runtime(self) -> str:
        return self.runner.runtime

    def run(self, inputs: Sequence[np.ndarray]) -> RunResult:
        self._start()
        return self.runner.run(inputs)

    def timer(self, inputs: Sequence[np.ndarray]) -> Callable[[], None]:
        self._start()
        return self.runner.timer(inputs)

    def timed(self, inputs: Sequence[np.ndarray], timing: Timing[T], *, calls: int = 1) -> T:
        return timing(self.timer(inputs))

    def memory(self) -> Growth | None:
        peak = peak_resident()
        if self._before is None or peak is None:
            return None
        return Growth(self._before, peak, self._reset)

    def __enter__(self) -> Measured:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self._reset = reset_peak()
            self._before = resident()
