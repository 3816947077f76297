"""One batch job in its own process: `python -m mpconvert.batch.worker SPEC.json`.

Each model converts in a process of its own, so TensorFlow's global state,
memory and crashes stay contained: a model that crashes the interpreter or
exhausts memory is that model's error, not the batch's. The worker runs the
same conversion as the CLI and the Python API (`pipeline.convert_and_save`)
and leaves its verdict in a small JSON file for the batch to read; a worker
that leaves none has crashed. Its spec carries the job's options whole, as
the keywords that rebuild them (`job_spec`, `job_options`), so an option
added to an options class reaches the worker with nothing to add here.

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
from pathlib import Path
from typing import TYPE_CHECKING

from mpconvert.options.keywords import keywords_of
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


def job_spec(job: Job) -> dict:
    """What a worker needs of a job, as JSON can hold it; `job_options` rebuilds its options."""
    return {
        "model": str(job.model),
        "given_path": job.given_path,
        "policy": job.policy,
        "options": keywords_of(job.options),
        "export": keywords_of(job.export),
    }


def job_options(spec: dict) -> tuple[ConvertOptions, ExportOptions]:
    """The job's options again, equal to the ones the batch built, through the same API functions."""
    from mpconvert.api import conversion_options, export_options

    conversion = conversion_options(Path(spec["model"]), spec["policy"], **spec["options"])
    return conversion, export_options(**spec["export"])


def run(spec: dict) -> dict:
    """Convert one job; returns {status, message, exit_code}."""
    from mpconvert.export.tracking import RunNotRecorded
    from mpconvert.options.export import SaveOptions
    from mpconvert.options.tracking import TrackingOptions
    from mpconvert.pipeline import convert_and_save
    from mpconvert.system.hooks import Hooks

    options, export = job_options(spec)
    tracking = spec.get("tracking")
    stamp = {"key": spec["key"], "model": spec["given_path"], "policy": spec["policy"]}
    command = spec.get("command")
    save = SaveOptions(
        Path(spec["out"]),
        export,
        force=True,
        attachments=((RESULT_NAME, stamp),),
        command=None if command is None else tuple(command),
        tracking=TrackingOptions(**tracking) if tracking else TrackingOptions(),
    )
    try:
        report, _ = convert_and_save(options, save, Hooks(may_restart=True))
    except RunNotRecorded:
        # Written but not tracked: without its stamp, --resume converts (and logs) it again instead of reusing it.
        (Path(spec["out"]) / RESULT_NAME).unlink(missing_ok=True)
        raise
    status = "passed" if report.passed else "gate_failed"
    failed = [c.name for c in report.gate.failed]
    return {"status": status, "message": "" if report.passed else "failed: " + ", ".join(failed)}


def main(argv: list[str]) -> int:
    spec_path = Path(argv[0])
    spec = json.loads(spec_path.read_text())
    _die_with_parent(spec["parent"])
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
        result = {"status": "error", "message": message[:500]}
    result["seconds"] = round(time.perf_counter() - started, 3)
    replace_atomically(Path(spec["result"]), json.dumps(result, indent=2, allow_nan=False), "a worker's result")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
