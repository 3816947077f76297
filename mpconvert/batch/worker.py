"""One batch job in its own process: `python -m mpconvert.batch.worker SPEC.json`.

Each model converts in a process of its own, so TensorFlow's global state,
memory and crashes stay contained: a model that crashes the interpreter or
exhausts memory is that model's error, not the batch's. The worker runs the
same conversion as the CLI and the Python API (`pipeline.convert_and_save`)
and leaves its verdict in a small JSON file for the batch to read; a worker
that leaves none has crashed. Its spec (`WorkerSpec`) carries the job's
options whole, as the keywords that rebuild them (`job_spec`,
`job_options`), so an option added to an options class reaches the worker with
nothing to add here.

A worker must not outlive its batch: if the batch is killed (SIGKILL gives
it no chance to clean up), the kernel kills the worker too (Linux
PR_SET_PDEATHSIG), and elsewhere a watchdog thread notices the new parent.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpconvert.options.keywords import keywords_of
from mpconvert.options.tracking import TrackingOptions
from mpconvert.report.batch import Status
from mpconvert.report.sections import JSONValue, native
from mpconvert.system.errors import failure_of
from mpconvert.system.writing import replace_atomically

if TYPE_CHECKING:
    from mpconvert.batch.manifest import Job
    from mpconvert.options.convert import ConvertOptions
    from mpconvert.options.export import ExportOptions

RESULT_NAME = "batch_result.json"  # in each result folder: its key, written with it
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the watchdog below still works

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(0.5)

    if os.getppid() != parent:  # the batch died before the prctl took effect
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs of a job, as JSON can hold it: the job's options as the keywords that rebuild them
    (`job_options`), and where the batch wants its result. Written to a file (or sent to a Ray task) by the
    batch, read back by the worker."""

    model: str
    given_path: str  # the model as the manifest gave it
    policy: str
    options: Mapping[str, JSONValue]  # keywords_of(the job's ConvertOptions)
    export: Mapping[str, JSONValue]  # keywords_of(its ExportOptions)
    out: str = ""  # its result folder
    key: str = ""  # its content key, stamped in RESULT_NAME
    parent: int = 0  # the batch's process id: the worker dies with it
    result: str = ""  # where the worker leaves its WorkerResult
    command: tuple[str, ...] | None = None  # the batch's command line, for the report's provenance
    tracking: TrackingOptions | None = None  # MLflow, with the batch's parent run
    cwd: str | None = None  # a Ray task: the batch's working folder, where its node has it
    # --sign-key's path; an encrypted key's password reaches the worker in its environment, never in a spec.
    sign_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        found = {
            "model": self.model,
            "given_path": self.given_path,
            "policy": self.policy,
            "options": dict(self.options),
            "export": dict(self.export),
            "out": self.out,
            "key": self.key,
            "parent": self.parent,
            "command": None if self.command is None else list(self.command),
            "tracking": None if self.tracking is None else self.tracking.spec(),
            "result": self.result,
        }
        found = found if self.sign_key is None else {**found, "sign_key": self.sign_key}
        return found if self.cwd is None else {**found, "cwd": self.cwd}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> WorkerSpec:
        command, tracking = stored.get("command"), stored.get("tracking")
        return cls(
            model=stored["model"],
            given_path=stored["given_path"],
            policy=stored["policy"],
            options=stored["options"],
            export=stored["export"],
            out=stored.get("out", ""),
            key=stored.get("key", ""),
            parent=stored.get("parent", 0),
            result=stored.get("result", ""),
            command=None if command is None else tuple(command),
            tracking=None if tracking is None else TrackingOptions(**tracking),
            cwd=stored.get("cwd"),
            sign_key=stored.get("sign_key"),
        )


@dataclass(frozen=True)
class WorkerResult:
    """What a worker leaves for the batch: how its job ended (a worker that leaves none has crashed)."""

    status: Status
    message: str
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"status": native(self.status), "message": self.message, "seconds": self.seconds}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> WorkerResult:
        return cls(Status(stored["status"]), stored.get("message", ""), stored.get("seconds", 0.0))


def job_spec(job: Job) -> WorkerSpec:
    """What a worker needs of a job; the batch adds where its result goes, `job_options` rebuilds its options."""
    return WorkerSpec(
        model=str(job.model),
        given_path=job.given_path,
        policy=job.policy,
        options=keywords_of(job.options),
        export=keywords_of(job.export),
    )


def job_options(spec: WorkerSpec) -> tuple[ConvertOptions, ExportOptions]:
    """The job's options again, equal to the ones the batch built, through the same API functions."""
    from mpconvert.api import conversion_options, export_options

    conversion = conversion_options(Path(spec.model), spec.policy, **spec.options)
    return conversion, export_options(**spec.export)


def run(spec: WorkerSpec) -> WorkerResult:
    """Convert one job; returns how it ended (the seconds are main's)."""
    from mpconvert.commands.signature import load_signer
    from mpconvert.export.tracking import RunNotRecorded
    from mpconvert.options.export import SaveOptions
    from mpconvert.options.signing import SigningOptions
    from mpconvert.options.tracking import TrackingOptions
    from mpconvert.pipeline import convert_and_save
    from mpconvert.system.hooks import Hooks

    options, export = job_options(spec)
    signing = SigningOptions(Path(spec.sign_key) if spec.sign_key else None)
    signer = load_signer(signing)
    stamp = {"key": spec.key, "model": spec.given_path, "policy": spec.policy}
    if signer is not None:  # --resume with a key reuses only what that key signed
        stamp["signed_by"] = signer.fingerprint
    save = SaveOptions(
        Path(spec.out),
        export,
        force=True,
        attachments=((RESULT_NAME, stamp),),
        command=spec.command,
        tracking=spec.tracking or TrackingOptions(),
        signing=signing,
    )
    try:
        report, _ = convert_and_save(options, save, Hooks(may_restart=True))
    except RunNotRecorded:
        # Written but not tracked: without its stamp, --resume converts (and logs) it again instead of reusing it.
        (Path(spec.out) / RESULT_NAME).unlink(missing_ok=True)
        raise
    if report.passed:
        return WorkerResult(Status.PASSED, "")
    return WorkerResult(Status.GATE_FAILED, "failed: " + ", ".join(c.name for c in report.gate.failed))


def main(argv: list[str]) -> int:
    spec_path = Path(argv[0])
    spec = WorkerSpec.from_json(json.loads(spec_path.read_text()))
    _die_with_parent(spec.parent)
    from mpconvert.system.process import silence_frameworks, unwind_on_sigterm

    silence_frameworks()
    unwind_on_sigterm()  # a stopped batch stops its workers; they clean up like Ctrl-C
    started = time.perf_counter()
    from mpconvert.speed.slow_kernel import Restart

    try:
        result = run(spec)
    except Restart as exc:  # a broken 16-bit kernel: this worker again, with oneDNN's rewrites off
        from mpconvert.system.process import restart

        restart(exc, [sys.executable, "-m", "mpconvert.batch.worker", *argv], quiet=True)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the model's failure, reported as the model's error
        failure = failure_of(exc)
        message = failure.one_line()
        if failure.bug:  # where it happened, since the worker's traceback is not shown
            last = traceback.extract_tb(exc.__traceback__)[-1:]
            message += f" [at {last[0].filename}:{last[0].lineno}]" if last else ""
        result = WorkerResult(Status.ERROR, message[:500])
    result = replace(result, seconds=round(time.perf_counter() - started, 3))
    text = json.dumps(result.to_json(), indent=2, allow_nan=False)
    replace_atomically(Path(spec.result), text, "a worker's result")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
