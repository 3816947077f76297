"""`batch --executor ray`: each job a Ray task, on a Ray cluster or a local Ray.

A task runs the same worker process the local executor starts
(`python -m mpconvert.batch.worker SPEC`), in a folder of its own on
whichever node Ray chose, and hands back the worker's verdict, its log and
the finished result folder as a tar archive. The batch unpacks that into the
root (its local staging folder for a root in object storage), where the
runner treats it exactly like a local worker's: the same keys, stamps,
`--resume`, `batch-merge` and summary. Nodes need not share a file system
with the batch's machine for the results; they do need the models and data
files at the paths the manifest gives (a shared volume on a cluster).

A worker process that dies (its node lost, killed from outside, out of
memory) takes its Ray task's process with it, which Ray notices and retries
up to `RETRIES` times on a fresh worker; a conversion that fails is the
model's verdict and is not retried.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mpconvert.batch.worker import WorkerSpec
from mpconvert.system.errors import MpconvertError
from mpconvert.system.writing import writing

RETRIES = 3  # Ray's own default for a task whose worker died
_CONNECT_SECONDS = 5.0
_PREFIX = "mpconvert-ray-"  # a task's work folder on its node
_KILLED = -9  # what a cancelled or lost task reads as: the local executor's SIGKILL


def convert_remotely(spec: dict) -> dict:
    """One job inside a Ray task: the batch worker in a child process, its result folder packed up.

    The child is a fresh process (one TensorFlow runtime per conversion, as
    with the local executor), and it dies with this task's process. It runs
    in the batch's working folder where the node has it, as a local worker
    does, so that `--import` finds the same modules.
    """
    _remove_orphans()
    with tempfile.TemporaryDirectory(prefix=_PREFIX) as tmp:
        work = Path(tmp)
        (work / "pid").write_text(str(os.getpid()))
        here = dataclasses.replace(
            WorkerSpec.from_json(spec), out=str(work / "out"), result=str(work / "result.json"), parent=os.getpid()
        )
        (work / "spec.json").write_text(json.dumps(here.to_json()))
        cwd = here.cwd if here.cwd and Path(here.cwd).is_dir() else tmp
        with (work / "log").open("w") as log:
            code = subprocess.run(
                [sys.executable, "-m", "mpconvert.batch.worker", str(work / "spec.json")],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                check=False,
            ).returncode
        result = work / "result.json"
        archive = None
        if (work / "out").is_dir():
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                tar.add(work / "out", arcname=".")
            archive = buffer.getvalue()
        return {
            "code": code,
            "result": result.read_text() if result.is_file() else None,
            "log": (work / "log").read_text(errors="replace")[-20_000:],
            "archive": archive,
            "node": socket.gethostname(),
        }


def _remove_orphans() -> None:
    """The folders of earlier tasks on this node whose process was killed before it could remove its own."""
    for folder in Path(tempfile.gettempdir()).glob(_PREFIX + "*"):
        try:
            os.kill(int((folder / "pid").read_text()), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (OSError, ValueError):  # not ours to judge: another user's, or one being made
            continue


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MpconvertError(
            "--executor ray needs Ray, which is not installed", hint="pip install 'mpconvert[ray]'"
        ) from None
    return ray


def _reachable(address: str) -> None:
    """A cluster address that does not answer fails in seconds, not after Ray's minutes of retries."""
    if address in ("auto", "local"):
        return
    parts = urlsplit(address if "://" in address else "ray-gcs://" + address)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or not port:
        raise MpconvertError(
            f"--ray-address {address!r} is not HOST:PORT or ray://HOST:PORT",
            hint="give the head node's address, e.g. 10.0.0.5:6379 (or ray://10.0.0.5:10001 for Ray Client)",
        )
    try:
        socket.create_connection((host, port), timeout=_CONNECT_SECONDS).close()
    except OSError as exc:
        raise MpconvertError(
            f"the Ray cluster at {address} does not answer ({exc.strerror or exc})",
            hint="start it (ray start --head), or check --ray-address / RAY_ADDRESS; "
            "leave both unset to run on a local Ray",
        ) from None


class RayTask:
    """One submitted job, polled like a local worker process: an exit code once its task has ended."""

    def __init__(self, executor: RayExecutor, ref: Any, out: Path, result: Path, log: Path):
        self.executor = executor
        self.ref = ref
        self.out = out
        self.result = result
        self.log = log
        self.code: int | None = None

    def poll(self) -> int | None:
        if self.code is not None:
            return self.code
        ray = self.executor.ray
        ready, _ = ray.wait([self.ref], timeout=0)
        if not ready:
            return None
        try:
            answer = ray.get(self.ref)
        except Exception as exc:  # the task's worker died more than RETRIES times, or it was cancelled
            self.log.write_text(f"the Ray task failed: {type(exc).__name__}: {str(exc).strip()[:500]}\n")
            self.code = _KILLED
            return self.code
        self.log.write_text(answer["log"])
        if answer["archive"] is not None:
            self._unpack(answer["archive"])
        if answer["result"] is not None:
            self.result.write_text(answer["result"])
        self.code = answer["code"]
        return self.code

    def _unpack(self, archive: bytes) -> None:
        """The result folder in place whole: unpacked beside it, then renamed over it."""
        staging = self.out.with_name(self.out.name + ".ray-unpack")
        with writing(self.out, "a Ray task's result folder"):
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(staging, filter="data")
            shutil.rmtree(self.out, ignore_errors=True)
            os.replace(staging, self.out)

    def kill(self) -> None:
        if self.code is None:
            with contextlib.suppress(Exception):
                self.executor.ray.cancel(self.ref, force=True, recursive=True)
            self.code = _KILLED

    terminate = kill  # a Ray task cannot be asked to unwind: force-cancelling it kills its worker process

    def wait(self, timeout: float | None = None) -> int | None:
        return self.code


class RayExecutor:
    """The connection to Ray for one batch; `start` submits a job."""

    def __init__(self, address: str | None):
        self.ray = _ray()
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address:
            _reachable(address)
        self.address = address or "a local Ray"
        # Ray's driver prints what the cluster reports (a worker that died) on stdout, where
        # --json writes the summary: for the batch's lifetime, stdout's writes go to stderr.
        self.stdout = contextlib.redirect_stdout(sys.stderr)
        self.stdout.__enter__()
        # Connecting to a running cluster refuses the settings of a new one (the dashboard's).
        own = {} if address else {"include_dashboard": False}
        try:
            self.ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, **own)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            self.stdout.__exit__(None, None, None)
            raise MpconvertError(
                f"cannot connect to Ray at {self.address}: {str(exc).strip().splitlines()[0][:300]}",
                hint="check --ray-address / RAY_ADDRESS and that the cluster's Ray version is this one's; a cluster "
                "with token authentication (a head started where ~/.ray/auth_token exists takes it) needs "
                "RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN, or ~/.ray/auth_token) here",
            ) from None
        self.remote = self.ray.remote(num_cpus=1, max_retries=RETRIES)(convert_remotely)

    def slots(self) -> int:
        """Jobs at a time: the cluster's CPUs, one per job."""
        return max(1, int(self.ray.cluster_resources().get("CPU", 1)))

    def start(self, spec: WorkerSpec, out: Path, result: Path, log: Path) -> RayTask:
        # The spec crosses to the task as its JSON form (plain values Ray can send anywhere).
        sent = dataclasses.replace(spec, cwd=os.getcwd()).to_json()
        return RayTask(self, self.remote.remote(sent), out, result, log)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ray.shutdown()
        self.stdout.__exit__(None, None, None)
