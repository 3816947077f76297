"""A runner whose runs happen in a child process: a runtime that takes its process down takes only the child.

ONNX Runtime 1.31 calls std::terminate on the ONNX file of an unmasked
Bidirectional(LSTM) fed 0 rows (its LSTM op), and OpenVINO 2026.4 dies of
SIGFPE on the same file: no exception reaches Python, and a check run
in-process took mpconvert down with it (exit 134, no report, the staging
folder and its lock left behind). Every run of a written or received ONNX
file (a conversion's checks of what it wrote, `verify`'s of a folder that
may be foreign or damaged) goes through `Isolated` instead, as the
slow-kernel probe runs in a child (speed/kernel_probe.py): one child per
artifact (`python -m mpconvert.runners.isolated`), kept for all its runs.
A child that dies is named as the run's failure (`Crashed`: which signal, on
how many rows), and the next run starts a new one. A child that does not
answer within its deadline (`DEADLINE_S` per call it makes) is stopped and
named too (`Hung`). What the runner raises comes back as raised, so callers
see the same errors as in-process.

The child wraps its runner in a `Measured` (measured.py): `timed` times the
prepared call there (the pipe is not in the figures) and `memory` is the
child's own resident memory growth from just before its first run, the
modules named in `preload` (the runtime) imported before that. `timer`
prepares the call in the child and each call of what it returns is one
request, the pipe included: time with `timed` where the figure matters.

The wrapped runner is pickled to the child: a plain frozen dataclass naming
its file (OnnxRunner, with its providers chosen here, so that the child
probes none).
"""

from __future__ import annotations

import importlib
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from mpconvert.runners.base import Runner, RunResult
from mpconvert.runners.measured import Growth, Measured, T, Timing
from mpconvert.system.errors import MpconvertError

# How long one call of the model may take in the child before it counts as a hang and is stopped. The
# slowest run mpconvert makes is the last resort, onnx.reference, on a check's large batch: MobileNetV2
# (224x224) took 2.4 s for 4 rows there on 2 cores, about 4.5 min for its 437-row batch. 30 min is
# several times that, and still ends a CI job that would otherwise wait for its own timeout.
DEADLINE_S = 1800.0
_WHAT = {"onnxruntime": "ONNX Runtime", "litert": "the LiteRT interpreter", "tensorflow": "TensorFlow"}
_VERBS = {
    signal.SIGABRT: "aborted the process",
    signal.SIGSEGV: "crashed the process",
    signal.SIGFPE: "crashed the process",
    signal.SIGBUS: "crashed the process",
    signal.SIGKILL: "was killed with the process (the kernel's out-of-memory killer sends SIGKILL)",
}


class Crashed(MpconvertError):
    """The runtime took its (child) process down on a run: the finding, in one line."""


class Hung(Crashed):
    """The runtime did not answer within the deadline: its child was stopped, and that is the finding."""


def runtime_words(runtime: str) -> str:
    """A runner's runtime ("onnxruntime:CPUExecutionProvider") as a sentence names it ("ONNX Runtime")."""
    return next((words for key, words in _WHAT.items() if runtime.startswith(key)), runtime)


@dataclass
class Isolated:
    """`runner`'s runs in a child process; use it as a context manager (the child ends with it).

    `preload`: modules the child imports before its first run (the runtime, what times it), so that
    `memory` is the file's own; `deadline_s`: how long one call may take before the child is stopped.
    """

    runner: Runner
    preload: tuple[str, ...] = ()
    deadline_s: float = DEADLINE_S
    _child: subprocess.Popen | None = field(default=None, repr=False)
    _stderr: IO[bytes] | None = field(default=None, repr=False)

    @property
    def runtime(self) -> str:
        return self.runner.runtime

    def run(self, inputs: Sequence[np.ndarray]) -> RunResult:
        return self._ask(("run", _arrays(inputs)), _rows(inputs))

    def timed(self, inputs: Sequence[np.ndarray], timing: Timing[T], *, calls: int = 1) -> T:
        """`timing(call)` run in the child on its prepared call; given `calls` times the deadline."""
        return self._ask(("time", _arrays(inputs), timing), _rows(inputs), calls)

    def timer(self, inputs: Sequence[np.ndarray]) -> Callable[[], None]:
        rows = _rows(inputs)
        self._ask(("prepare", _arrays(inputs)), rows)
        return lambda: self._ask(("call",), rows)

    def memory(self) -> Growth | None:
        """The child's growth since its first run; None where no child is running (it died, or never ran)."""
        if self._child is None or self._child.poll() is not None:
            return None
        return self._ask(("memory",), 0)

    def close(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            for stream in (child.stdin, child.stdout):
                if stream is not None:
                    stream.close()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Isolated:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ask(self, request: tuple, rows: int, calls: int = 1) -> Any:
        try:
            child = self._start()
            assert child.stdin is not None and child.stdout is not None
            pickle.dump(request, child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            child.stdin.flush()
            deadline = self.deadline_s * max(1, calls)
            # One answer per request and nothing after it: the pipe is empty when it is not ready.
            if not select.select([child.stdout], [], [], deadline)[0]:
                raise self._hung(rows, deadline)
            answer = pickle.load(child.stdout)
        except (BrokenPipeError, EOFError, pickle.UnpicklingError, OSError):
            raise self._crashed(rows) from None
        if answer[0] == "ran":
            return answer[1]
        if answer[0] == "mpconvert":
            raise MpconvertError(answer[1], hint=answer[2])
        if answer[0] == "raised":
            raise answer[1]
        raise RuntimeError(answer[1])  # an exception that could not cross the pipe, as "Type: message"

    def _start(self) -> subprocess.Popen:
        if self._child is not None and self._child.poll() is None:
            return self._child
        self.close()
        # The child's last words (ONNX Runtime's "terminate called ...") go to a file, read if it dies.
        self._stderr = tempfile.TemporaryFile()
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "mpconvert.runners.isolated"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
            )
        except OSError as exc:
            self.close()
            raise MpconvertError(
                f"cannot start a child process to run the file in: {exc}", hint="free memory or process slots"
            ) from exc
        assert self._child.stdin is not None
        pickle.dump((self.runner, self.preload), self._child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        return self._child

    def _hung(self, rows: int, deadline: float) -> Hung:
        child = self._child
        assert child is not None
        child.kill()
        child.wait()
        self.close()
        what = runtime_words(self.runner.runtime)
        return Hung(
            f"{what} did not answer within {deadline:g} s on {rows} rows (the deadline of a run; a hang?): "
            "its child process was stopped",
            hint=f"a bug of {what}'s on this file, or a machine far slower than the deadline allows: serve "
            f"another artifact of this model, or try another {what} version on it",
        )

    def _crashed(self, rows: int) -> Crashed:
        child, stderr = self._child, self._stderr
        assert child is not None
        try:
            code = child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            code = child.wait()
        said = ""
        if stderr is not None:
            stderr.seek(0)
            lines = [line.strip() for line in stderr.read().decode(errors="replace").splitlines() if line.strip()]
            said = f': "{lines[-1][:200]}"' if lines else ""
        what = runtime_words(self.runner.runtime)
        if code < 0:
            sig = signal.Signals(-code)
            how = f"{_VERBS.get(sig, 'crashed the process')} ({sig.name})"
        else:
            how = f"ended the process (exit status {code})"
        self.close()
        return Crashed(
            f"{what} {how} on {rows} rows{said}",
            hint=f"a bug of {what}'s on this file: serve another artifact of this model, or try another {what} "
            "version on it",
        )


def _arrays(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(x) for x in inputs]


def _rows(inputs: Sequence[np.ndarray]) -> int:
    return len(inputs[0]) if len(inputs) else 0


# --- the child ---------------------------------------------------------------------


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    runner, preload = pickle.load(requests)
    for module in preload:
        importlib.import_module(module)
    measured = Measured(runner)
    prepared: Callable[[], None] | None = None
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            return
        answer: tuple[Any, ...]
        try:
            if request[0] == "run":
                answer = ("ran", measured.run(request[1]))
            elif request[0] == "time":
                answer = ("ran", measured.timed(request[1], request[2]))
            elif request[0] == "prepare":
                prepared = measured.timer(request[1])
                answer = ("ran", None)
            elif request[0] == "call":
                assert prepared is not None, "a call before its prepare"
                prepared()  # its outputs stay here: a timed call carries none through the pipe
                answer = ("ran", None)
            else:
                answer = ("ran", measured.memory())
        except MpconvertError as exc:
            answer = ("mpconvert", exc.message, exc.hint)
        except Exception as exc:  # the runtime's own error: the parent raises it again
            try:
                pickle.loads(pickle.dumps(exc))
                answer = ("raised", exc)
            except Exception:
                answer = ("unpicklable", f"{type(exc).__name__}: {exc}")
        pickle.dump(answer, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()


if __name__ == "__main__":
    # The answers keep this process's stdout to themselves: whatever a native library prints to fd 1
    # goes to stderr instead.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, answers)
