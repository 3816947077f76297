"""batch.json as typed values: one entry per model and policy, the totals and the verdict.

The values are here, in the core, so that the renderings (render/batch.py,
the batch page) can take them; batch/results.py builds them from each
job's report (and re-exports them). batch.json is `to_json()`, made where
the file is written, and `from_json` reads one back (a --baseline, the
shards of a merge) of any version this mpconvert writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from mpconvert.options.validate import Metric
from mpconvert.report.report import EXIT_FAILED, EXIT_GATE, EXIT_OK
from mpconvert.report.schema import SCHEMA_VERSION
from mpconvert.report.sections import member, native


class Status(StrEnum):
    """How one model and policy of a batch ended."""

    PASSED = "passed"
    GATE_FAILED = "gate_failed"  # converted, and a gate check failed
    ERROR = "error"  # the input, the conversion or the worker failed
    TIMED_OUT = "timed_out"  # no result within --timeout

    @property
    def converted(self) -> bool:
        """It has a result folder with its report."""
        return self in (Status.PASSED, Status.GATE_FAILED)


def _metric(value: Any) -> Metric | str | None:
    return None if value is None else member(Metric, value)


@dataclass(frozen=True)
class BaselineChange:
    """The same model (or output) in the --baseline batch.json: its converted metric then, and how much worse now."""

    after: float | None
    regression: float | None

    def to_json(self) -> dict[str, float | None]:
        return {"after": native(self.after), "regression": native(self.regression)}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> BaselineChange:
        return cls(stored.get("after"), stored.get("regression"))


@dataclass(frozen=True)
class OutputEntry:
    """One scored output of a model with several: its metric before and after the conversion."""

    name: str
    metric: Metric | str
    before: float | None
    after: float | None
    drop: float | None
    baseline: BaselineChange | None = None

    def to_json(self) -> dict[str, Any]:
        found = {
            "name": self.name,
            "metric": native(self.metric),
            "before": native(self.before),
            "after": native(self.after),
            "drop": native(self.drop),
        }
        return found if self.baseline is None else {**found, "baseline": self.baseline.to_json()}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> OutputEntry:
        baseline = stored.get("baseline")
        return cls(
            stored["name"],
            member(Metric, stored["metric"]),
            stored.get("before"),
            stored.get("after"),
            stored.get("drop"),
            None if baseline is None else BaselineChange.from_json(baseline),
        )


@dataclass(frozen=True)
class BatchEntry:
    """One model and policy of a batch: how it ended, and its figures from its report.json."""

    name: str
    path: str  # the model as the manifest gave it
    policy: str
    status: Status | str
    message: str  # why it failed, in one line ("" when it passed)
    folder: str  # its result folder, relative to the root
    key: str  # its content key (batch/key.py): --resume reuses a result only under the same key
    reused: bool  # found complete under the same key (--resume), not converted again
    seconds: float
    metric: Metric | str | None = None
    before: float | None = None
    after: float | None = None
    drop: float | None = None
    kept_float32_share: float | None = None  # layers kept float32, of those with a policy
    onnx_bytes: int | None = None
    onnx_vs_float32: float | None = None  # the ONNX file's size against 4 bytes a parameter
    step_time_ratio: float | None = None  # the fine-tune's step time, converted / float32
    failed_checks: tuple[str, ...] = ()
    outputs: tuple[OutputEntry, ...] | None = None  # several outputs: each scored one's figures
    baseline: BaselineChange | None = None  # --baseline: the same model in it (one output)
    root: str | None = None  # merged shards of separate roots: the root that holds its folder

    @property
    def converted(self) -> bool:
        return self.status in (Status.PASSED, Status.GATE_FAILED)

    def with_status(self, status: Status, message: str, failed_check: str) -> BatchEntry:
        return replace(self, status=status, message=message, failed_checks=(*self.failed_checks, failed_check))

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "name": self.name,
            "path": self.path,
            "policy": self.policy,
            "status": native(self.status),
            "message": self.message,
            "folder": self.folder,
            "key": self.key,
            "reused": self.reused,
            "seconds": self.seconds,
            "metric": native(self.metric),
            "before": native(self.before),
            "after": native(self.after),
            "drop": native(self.drop),
            "kept_float32_share": self.kept_float32_share,
            "onnx_bytes": self.onnx_bytes,
            "onnx_vs_float32": self.onnx_vs_float32,
            "step_time_ratio": native(self.step_time_ratio),
            "failed_checks": list(self.failed_checks),
        }
        if self.outputs is not None:
            found["outputs"] = [o.to_json() for o in self.outputs]
        if self.baseline is not None:
            found["baseline"] = self.baseline.to_json()
        if self.root is not None:
            found["root"] = self.root
        return found

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> BatchEntry:
        outputs, baseline = stored.get("outputs"), stored.get("baseline")
        return cls(
            name=stored["name"],
            path=stored.get("path", ""),
            policy=stored["policy"],
            status=member(Status, stored["status"]),
            message=stored.get("message", ""),
            folder=stored["folder"],
            key=stored.get("key", ""),
            reused=bool(stored.get("reused", False)),
            seconds=stored.get("seconds", 0.0),
            metric=_metric(stored.get("metric")),
            before=stored.get("before"),
            after=stored.get("after"),
            drop=stored.get("drop"),
            kept_float32_share=stored.get("kept_float32_share"),
            onnx_bytes=stored.get("onnx_bytes"),
            onnx_vs_float32=stored.get("onnx_vs_float32"),
            step_time_ratio=stored.get("step_time_ratio"),
            failed_checks=tuple(stored.get("failed_checks") or ()),
            outputs=None if outputs is None else tuple(OutputEntry.from_json(o) for o in outputs),
            baseline=None if baseline is None else BaselineChange.from_json(baseline),
            root=stored.get("root"),
        )


@dataclass(frozen=True)
class Totals:
    """How many entries ended each way, and how fast the batch went."""

    passed: int
    gate_failed: int
    error: int
    timed_out: int
    models: int
    reused: int
    elapsed_seconds: float
    models_per_minute: float | None  # converted (not reused) per minute of the batch; None when none was

    @classmethod
    def of(cls, entries: tuple[BatchEntry, ...], elapsed: float) -> Totals:
        counts = {status.value: sum(1 for m in entries if m.status == status) for status in Status}
        converted = sum(1 for m in entries if not m.reused and m.converted)
        return cls(
            **counts,
            models=len(entries),
            reused=sum(1 for m in entries if m.reused),
            elapsed_seconds=round(elapsed, 3),
            models_per_minute=round(converted / (elapsed / 60), 3) if elapsed > 0 and converted else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "gate_failed": self.gate_failed,
            "error": self.error,
            "timed_out": self.timed_out,
            "models": self.models,
            "reused": self.reused,
            "elapsed_seconds": self.elapsed_seconds,
            "models_per_minute": self.models_per_minute,
        }

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Totals:
        return cls(
            **{key: stored.get(key, 0) for key in ("passed", "gate_failed", "error", "timed_out")},
            models=stored.get("models", 0),
            reused=stored.get("reused", 0),
            elapsed_seconds=stored.get("elapsed_seconds", 0.0),
            models_per_minute=stored.get("models_per_minute"),
        )


def exit_code_of(entries: tuple[BatchEntry, ...]) -> int:
    """Errors and timeouts first (1), then gate failures (3), else 0."""
    statuses = {m.status for m in entries}
    if statuses & {Status.ERROR, Status.TIMED_OUT}:
        return EXIT_FAILED
    return EXIT_GATE if Status.GATE_FAILED in statuses else EXIT_OK


@dataclass(frozen=True)
class BatchSummary:
    """batch.json: a batch run's (or a shard's, or merged shards') entries, in folder order, and its verdict."""

    root: str | None  # the root (folder or URL); None for merged shards of separate roots
    shard: tuple[int, int] | None  # (index from 1, count) for a shard's own summary
    shard_source: str | None  # why this shard: the flag or the scheduler's variables
    finished: bool  # every job of the run (or shard) has its outcome
    jobs: int | None  # workers at a time (summed over merged shards)
    models: tuple[BatchEntry, ...]
    totals: Totals
    executor: str | None = None  # local or ray; None for merged shards, and batches from before it
    shards: tuple[str | None, ...] | None = None  # merged: the roots of the shards it merged

    @property
    def exit_code(self) -> int:
        return exit_code_of(self.models)

    @property
    def passed(self) -> bool:
        return self.exit_code == EXIT_OK

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "root": self.root,
            "shard": None if self.shard is None else list(self.shard),
            "shard_source": self.shard_source,
            "finished": self.finished,
        }
        if self.shards is not None:
            found["shards"] = list(self.shards)
        found["jobs"] = self.jobs
        if self.executor is not None:
            found["executor"] = self.executor
        return {
            **found,
            "models": [m.to_json() for m in self.models],
            "totals": self.totals.to_json(),
            "exit_code": self.exit_code,
            "passed": self.passed,
        }

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> BatchSummary:
        """A batch.json's content (its version checked by the reader); the verdict is derived from its entries."""
        shard, shards = stored.get("shard"), stored.get("shards")
        return cls(
            root=stored.get("root"),
            shard=None if not shard else (int(shard[0]), int(shard[1])),
            shard_source=stored.get("shard_source"),
            finished=bool(stored.get("finished", True)),
            jobs=stored.get("jobs"),
            models=tuple(BatchEntry.from_json(m) for m in stored["models"]),
            totals=Totals.from_json(stored.get("totals") or {}),
            executor=stored.get("executor"),
            shards=None if shards is None else tuple(shards),
        )
