"""A runner whose runs happen in a child process: a runtime that takes its process down takes only the child.

ONNX Runtime 1.31 calls std::terminate on the ONNX file of an unmasked
Bidirectional(LSTM) fed 0 rows (its LSTM op), and OpenVINO 2026.4 dies of
SIGFPE on the same file: no exception reaches Python, and a check run
in-process took mpconvert down with it (exit 134, no report, the staging
folder and its lock left behind). The checks of a written file (its first
run, and the batch sizes a server sends) run through `Isolated` instead, as
the slow-kernel probe runs in a child (speed/kernel_probe.py): one child per
artifact (`python -m mpconvert.runners.isolated`), kept for all its runs.
A child that dies is named as the run's failure (`Crashed`: which signal, on
how many rows), and the next run starts a new one. What the runner raises
comes back as raised, so callers see the same errors as in-process.

The wrapped runner is pickled to the child: a plain frozen dataclass naming
its file (OnnxRunner, with its providers chosen here, so that the child
probes none). Its `timer` runs here: timing needs the session in this process,
and the file has been run at those sizes by then.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from mpconvert.runners.base import Runner, RunResult
from mpconvert.system.errors import MpconvertError

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


def runtime_words(runtime: str) -> str:
    """A runner's runtime ("onnxruntime:CPUExecutionProvider") as a sentence names it ("ONNX Runtime")."""
    return next((words for key, words in _WHAT.items() if runtime.startswith(key)), runtime)


@dataclass
class Isolated:
    """`runner`'s runs in a child process; use it as a context manager (the child ends with it)."""

    runner: Runner
    _child: subprocess.Popen | None = field(default=None, repr=False)
    _stderr: IO[bytes] | None = field(default=None, repr=False)

    @property
    def runtime(self) -> str:
        return self.runner.runtime

    def run(self, inputs: Sequence[np.ndarray]) -> RunResult:
        rows = len(inputs[0]) if len(inputs) else 0
        try:
            child = self._start()
            assert child.stdin is not None and child.stdout is not None
            pickle.dump([np.asarray(x) for x in inputs], child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            child.stdin.flush()
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

    def timer(self, inputs: Sequence[np.ndarray]) -> Callable[[], None]:
        return self.runner.timer(inputs)

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
        pickle.dump(self.runner, self._child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        return self._child

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


# --- the child ---------------------------------------------------------------------


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    runner = pickle.load(requests)
    while True:
        try:
            inputs = pickle.load(requests)
        except EOFError:
            return
        answer: tuple[Any, ...]
        try:
            answer = ("ran", runner.run(inputs))
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
