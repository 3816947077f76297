"""Run a batch: each job in its own worker process, N at a time, resumable, shardable.

Results go under one root, one folder per model and policy (what the
single-model command writes, plus `batch_result.json` holding the key), and
`ROOT/batch.json` lists every job's outcome. `batch.json` is rewritten after
each job, so a killed batch leaves the record of what it finished; `--resume`
trusts only the result folders and their keys, so nothing partial is reused.
A shard writes its own summary instead, and the last shard of a root to
finish writes the combined batch.json (shards.py). The root may be in
object storage: the runner then works in a local staging folder that
storage.py keeps in step with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mpconvert.batch.key import job_key
from mpconvert.batch.manifest import Job
from mpconvert.batch.results import BATCH_NAME, entry, failed_entry, finish, read_batch, reused_entry
from mpconvert.batch.shards import combine_if_last, shard_summary_name
from mpconvert.batch.storage import Root, open_root
from mpconvert.batch.worker import RESULT_NAME, WorkerResult, WorkerSpec, job_spec
from mpconvert.commands.signature import Signer, load_signer
from mpconvert.options.batch import BatchOptions
from mpconvert.report.batch import BatchEntry, BatchSummary, Status
from mpconvert.report.report import REPORT_NAME, Report
from mpconvert.system import interrupts
from mpconvert.system.errors import MpconvertError
from mpconvert.system.memory import available_memory
from mpconvert.system.outdir import claimed_root, clear_dead_run
from mpconvert.system.writing import writing

_WORK = ".mpconvert-batch"  # specs, results and logs of running workers, under the root
_POLL = 0.2
# What one worker needs at most for the models this tool is meant for
# (TensorFlow's runtime, a model and its 16-bit copy, tf2onnx's graph copies):
# the measured peak for ResNet50 with ONNX export was about 3 GiB.
_MEMORY_PER_JOB = 3 << 30


def default_jobs() -> int:
    """As many workers as there are cores, and no more than memory allows."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    memory = available_memory()
    by_memory = max(1, memory // _MEMORY_PER_JOB) if memory else cores
    return max(1, min(cores, by_memory))


def shard_of(jobs: list[Job], index: int, count: int) -> list[Job]:
    """Shard `index` of `count`: largest models first, each to the lightest shard.

    Deterministic for a given manifest, so N machines running shards 1..N
    split the work without talking to each other.
    """
    sizes = [job.size() for job in jobs]
    loads = [0] * count
    mine = []
    for i in sorted(range(len(jobs)), key=lambda i: (-sizes[i], jobs[i].folder)):
        lightest = loads.index(min(loads))
        loads[lightest] += sizes[i] or 1
        if lightest == index - 1:
            mine.append(i)
    return [jobs[i] for i in sorted(mine)]


def _complete(root: Path, job: Job, key: str, signer: Signer | None) -> Report | None:
    """The report of a finished result with this key (and signed by `signer`'s key, when signing), else None."""
    folder = root / job.folder
    try:
        stamp = json.loads((folder / RESULT_NAME).read_text())
        stored = json.loads((folder / REPORT_NAME).read_text())
    except (OSError, ValueError):
        return None
    if signer is not None and stamp.get("signed_by") != signer.fingerprint:
        return None
    return Report.from_json(stored) if stamp.get("key") == key else None


def _refuse_existing(store: Root, jobs: list[Job]) -> None:
    root = store.local
    taken = [job.folder for job in jobs if (root / job.folder).is_dir() and any((root / job.folder).iterdir())]
    if taken:
        raise MpconvertError(
            f"{store.label} already holds results for {', '.join(taken[:5])}" + (" and more" if len(taken) > 5 else ""),
            hint="pass --resume to keep results whose inputs are unchanged, --force to convert again, "
            "or choose another --out",
        )


class Task(Protocol):
    """A started job as the runner sees it: an exit code once it has ended (negative: killed by that signal)."""

    def poll(self) -> int | None: ...
    def kill(self) -> None: ...
    def terminate(self) -> None: ...  # stop, letting the worker clean up
    def wait(self, timeout: float | None = None) -> int | None: ...  # subprocess.TimeoutExpired when still running


class Executor(Protocol):
    def slots(self) -> int: ...  # jobs at a time when --jobs is not given
    def start(self, spec: WorkerSpec, out: Path, result: Path, log: Path) -> Task: ...
    def close(self) -> None: ...


class _Process:
    """A local worker process, in a process group of its own (its children go with it)."""

    def __init__(self, process: subprocess.Popen):
        self.process = process

    def poll(self) -> int | None:
        return self.process.poll()

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)
        self.process.wait()

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int | None:
        return self.process.wait(timeout=timeout)


class LocalExecutor:
    """Each job a worker process on this machine."""

    def slots(self) -> int:
        return default_jobs()

    def start(self, spec: WorkerSpec, out: Path, result: Path, log: Path) -> Task:
        spec_path = result.with_name(result.name.removesuffix(".result.json") + ".spec.json")
        spec_path.write_text(json.dumps(spec.to_json()))
        with log.open("w") as handle:
            process = subprocess.Popen(
                [sys.executable, "-m", "mpconvert.batch.worker", str(spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=handle,
                start_new_session=True,
            )
        return _Process(process)

    def close(self) -> None:
        pass


def executor_for(options: BatchOptions) -> Executor:
    if options.executor == "ray":
        from mpconvert.batch.ray_executor import RayExecutor

        return RayExecutor(options.ray_address)
    return LocalExecutor()


@dataclass
class _Running:
    job: Job
    key: str
    task: Task
    result: Path
    log: Path
    started: float


@dataclass(frozen=True)
class BatchRun:
    """What a batch (or one shard of it) ends with."""

    summary: BatchSummary  # this run's batch.json: the whole batch's, or this shard's
    combined: BatchSummary | None  # a shard that finished last: the root's combined batch.json
    waiting: list[str]  # a shard that did not: the shards ("2/4") not finished yet
    path: str  # where `summary` (or `combined`) was written

    @property
    def result(self) -> BatchSummary:
        """The summary that speaks for the batch now: the combined one once there is one."""
        return self.combined or self.summary


class _Runner:
    def __init__(
        self,
        store: Root,
        options: BatchOptions,
        executor: Executor,
        on_event: Callable[[str, Job, BatchEntry | None], None],
    ):
        self.store = store
        self.executor = executor
        root = store.local
        self.root = root
        self.options = options
        self.on_event = on_event
        # Its own work folder per shard: shards may share a root.
        self.work = root / (_WORK + (f"-shard-{options.shard[0]}-of-{options.shard[1]}" if options.shard else ""))
        self.entries: list[BatchEntry] = []
        self.running: list[_Running] = []

    def start(self, job: Job, key: str) -> None:
        # Not with_suffix: a model name may hold dots ("resnet.v2").
        stem = str(self.work / job.folder.replace("/", "__"))
        result, log = Path(stem + ".result.json"), Path(stem + ".log")
        command = self.options.command
        spec = dataclasses.replace(
            job_spec(job),
            out=str(self.root / job.folder),
            key=key,
            parent=os.getpid(),
            result=str(result),
            command=None if command is None else tuple(command),
            tracking=self.options.tracking,
            sign_key=None if self.options.signing.key is None else str(Path(self.options.signing.key).absolute()),
        )
        task = self.executor.start(spec, self.root / job.folder, result, log)
        self.running.append(_Running(job, key, task, result, log, time.monotonic()))
        self.on_event("started", job, None)

    def poll(self) -> None:
        for run in list(self.running):
            elapsed = time.monotonic() - run.started
            code = run.task.poll()
            if code is None and self.options.timeout and elapsed > self.options.timeout:
                self._kill(run)
                self._done(
                    run,
                    failed_entry(
                        run.job,
                        run.key,
                        Status.TIMED_OUT,
                        f"no result after {self.options.timeout:g} s (--timeout)",
                        elapsed,
                    ),
                )
            elif code is not None:
                self._done(run, self._outcome(run, code, elapsed))

    def _outcome(self, run: _Running, code: int, elapsed: float) -> BatchEntry:
        try:
            result = WorkerResult.from_json(json.loads(run.result.read_text()))
        except (OSError, ValueError, KeyError):
            result = None
        if result is None:
            clear_dead_run(self.root / run.job.folder)
            return failed_entry(run.job, run.key, Status.ERROR, _crash_message(code, run.log), elapsed)
        if result.status == Status.ERROR:
            return failed_entry(run.job, run.key, Status.ERROR, result.message, result.seconds)
        report = Report.from_json(json.loads((self.root / run.job.folder / REPORT_NAME).read_text()))
        return entry(run.job, run.key, report, result.status, result.message, result.seconds)

    def _kill(self, run: _Running) -> None:
        run.task.kill()
        clear_dead_run(self.root / run.job.folder)

    def _done(self, run: _Running, item: BatchEntry) -> None:
        if item.converted:
            self.store.publish_result(run.job.folder)
        self.running.remove(run)
        self.entries.append(item)
        self.on_event("finished", run.job, item)

    def stop_all(self) -> None:
        """Stop the workers: SIGTERM so they clean up, then SIGKILL for the slow."""
        for run in self.running:
            run.task.terminate()
        deadline = time.monotonic() + 30
        for run in list(self.running):
            try:
                run.task.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill(run)
            clear_dead_run(self.root / run.job.folder)


def _crash_message(code: int, log: Path) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        message = f"the worker process died from {name}"
        if -code == signal.SIGKILL:
            message += " (killed from outside, or by the kernel when memory ran out)"
    else:
        message = f"the worker process exited with code {code} without a result"
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    return message + (f": {lines[-1][:200]}" if lines else "")


def run_batch(
    jobs: list[Job],
    options: BatchOptions,
    on_event: Callable[[str, Job, BatchEntry | None], None] = lambda *a: None,
) -> BatchRun:
    """Convert every job (this shard's), each in its own process.

    The root (or this shard's part of it) is claimed first, before anything
    in it is read or removed: a second batch of the same root fails at once
    and leaves the first one's workers alone. For a root in object storage,
    the claim is on its local staging folder: it keeps one machine from
    running a shard twice; the scheduler keeps machines from doing so.
    """
    signer = load_signer(options.signing)  # once, before any worker: a wrong password fails the batch, not N jobs
    store = open_root(options.root)
    if options.shard:
        jobs = shard_of(jobs, *options.shard)
    baseline = read_batch(options.baseline) if options.baseline else None
    try:
        # A cluster that does not answer fails here, before the root is touched.
        executor = executor_for(options)
        try:
            with claimed_root(store.local, options.shard):
                summary = _run_claimed(store, jobs, options, executor, on_event, baseline, signer)
                if signer is not None and not options.shard:
                    store.sign(summary, signer)
        finally:
            executor.close()
    finally:
        store.close([job.folder for job in jobs])
    if not options.shard:
        return BatchRun(summary, None, [], store.path(BATCH_NAME))
    combined, waiting = combine_if_last(store, options.shard[1])
    if combined is not None and signer is not None:  # the shard that wrote the root's batch.json signs it
        store.sign(combined, signer)
    where = BATCH_NAME if combined else shard_summary_name(*options.shard)
    return BatchRun(summary, combined, waiting, store.path(where))


def _run_claimed(
    store: Root,
    jobs: list[Job],
    options: BatchOptions,
    executor: Executor,
    on_event: Callable,
    baseline: BatchSummary | None,
    signer: Signer | None,
) -> BatchSummary:
    root = store.local
    with writing(root, "the batch root"):
        root.mkdir(parents=True, exist_ok=True)
    store.fetch_results([job.folder for job in jobs])
    if not options.resume and not options.force:
        _refuse_existing(store, jobs)
    runner = _Runner(store, options, executor, on_event)
    shutil.rmtree(runner.work, ignore_errors=True)
    with writing(runner.work, "the batch's work folder"):
        runner.work.mkdir()
    started = time.monotonic()
    pending: list[tuple[Job, str]] = []
    for job in jobs:
        key = job_key(job)
        stored = _complete(root, job, key, signer) if options.resume else None
        if stored is not None:
            item = reused_entry(job, key, stored)
            runner.entries.append(item)
            on_event("reused", job, item)
        else:
            pending.append((job, key))
    workers = options.jobs or executor.slots()
    name = shard_summary_name(*options.shard) if options.shard else BATCH_NAME

    def record(finished: bool = False) -> BatchSummary:
        elapsed = time.monotonic() - started
        summary = finish(store.label, runner.entries, elapsed, options, workers, baseline, finished)
        store.write_batch(name, summary)
        return summary

    try:
        while pending or runner.running:
            interrupts.check()
            while pending and len(runner.running) < workers:
                runner.start(*pending.pop(0))
            before = len(runner.entries)
            runner.poll()
            if len(runner.entries) != before:
                record()
            time.sleep(_POLL)
    except BaseException:
        runner.stop_all()
        # The first error is the one to report: a storage that just failed an
        # upload usually fails this summary's write too, and that must not hide it.
        with contextlib.suppress(Exception):
            record()
        raise
    finally:
        shutil.rmtree(runner.work, ignore_errors=True)
    return record(finished=True)
