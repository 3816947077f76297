"""batch.json: one entry per model and policy, totals, the verdict, and merging shards.

The entries and the summary are typed values (`BatchEntry`, `BatchSummary`:
report/batch.py, in the core so that the renderings can take them); this
module builds them from each job's report, applies a --baseline batch,
merges shards, and reads and writes the file. No TensorFlow: `batch-merge`
and the summaries run anywhere.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from mpconvert.options.tolerance import within
from mpconvert.report.batch import BaselineChange, BatchEntry, BatchSummary, OutputEntry, Status, Totals
from mpconvert.report.gate import layer_counts
from mpconvert.report.report import Report
from mpconvert.report.schema import check_version
from mpconvert.report.sections.validation import worse_by
from mpconvert.system.errors import MpconvertError
from mpconvert.system.writing import replace_atomically

__all__ = [
    "BATCH_NAME",
    "STATUSES",
    "BaselineChange",
    "BatchEntry",
    "BatchSummary",
    "OutputEntry",
    "Status",
    "Totals",
    "entry",
    "failed_entry",
    "finish",
    "merge",
    "parse_batch",
    "read_batch",
    "reused_entry",
    "write_batch",
]

BATCH_NAME = "batch.json"
STATUSES = tuple(Status)


def _base(job: Any, key: str, status: Status, message: str, seconds: float) -> BatchEntry:
    return BatchEntry(
        name=job.name,
        path=job.given_path,
        policy=job.policy,
        status=status,
        message=message,
        folder=job.folder,
        key=key,
        reused=False,
        seconds=round(seconds, 3),
    )


def entry(job: Any, key: str, report: Report, status: Status, message: str, seconds: float) -> BatchEntry:
    """A converted job's entry, its numbers taken from its report."""
    v = report.validation
    share = layer_counts(report.policy, report.layers).kept_share
    onnx = next((a for a in report.artifacts if a.kind == "onnx" and not a.failed), None)
    parameters = report.source.parameters
    outputs = None
    if v.outputs:  # several outputs: each scored one's numbers, by name
        outputs = tuple(
            OutputEntry(o.name, o.metric, o.reference, o.converted, o.drop) for o in v.outputs if o.metric is not None
        )
    return replace(
        _base(job, key, status, message, seconds),
        metric=v.metric,
        before=v.reference,
        after=v.converted,
        drop=v.drop,
        kept_float32_share=round(share, 4) if share is not None else None,
        # float32 weights take 4 bytes a parameter: the size the file would have in float32.
        onnx_bytes=onnx.bytes if onnx else None,
        onnx_vs_float32=round(onnx.bytes / (4 * parameters), 4) if onnx and parameters else None,
        step_time_ratio=report.finetune.step_time_ratio if report.finetune else None,
        failed_checks=tuple(c.name for c in report.gate.failed),
        outputs=outputs,
    )


def reused_entry(job: Any, key: str, report: Report) -> BatchEntry:
    """A result found complete under the same key (--resume): not converted again."""
    status = Status.PASSED if report.passed else Status.GATE_FAILED
    item = entry(job, key, report, status, "", 0.0)
    return replace(item, reused=True, message="" if report.passed else "failed: " + ", ".join(item.failed_checks))


def failed_entry(job: Any, key: str, status: Status, message: str, seconds: float) -> BatchEntry:
    return _base(job, key, status, message, seconds)


def _against(was: BatchEntry | OutputEntry | None, now: BatchEntry | OutputEntry) -> float | None:
    """How much worse `now` is than `was` (the single-model rule: worse_by); None when they are not comparable."""
    if not was or was.after is None or now.after is None or now.metric is None or was.metric != now.metric:
        return None
    return worse_by(now.metric, was.after, now.after)


def _with_baseline(item: BatchEntry, old: BatchEntry, max_regression: float) -> BatchEntry:
    """The single-model baseline rule (gate.py's: worse_by, then within), per model and output: no worse than before."""
    failing: list[tuple[str | None, BatchEntry | OutputEntry, BatchEntry | OutputEntry, float]] = []
    if item.outputs:  # several outputs: each against the same output before
        before = {o.name: o for o in old.outputs or ()}
        outputs = []
        for o in item.outputs:
            was = before.get(o.name)
            regression = _against(was, o)
            if was is not None and regression is not None:
                o = replace(o, baseline=BaselineChange(was.after, round(regression, 6)))
                failing += [] if within(regression, max_regression) else [(o.name, was, o, regression)]
            outputs.append(o)
        item = replace(item, outputs=tuple(outputs))
    else:
        regression = _against(old, item)
        if regression is not None:
            item = replace(item, baseline=BaselineChange(old.after, round(regression, 6)))
            failing += [] if within(regression, max_regression) else [(None, old, item, regression)]
    for output, then, now, regression in failing:
        if item.status != Status.PASSED:
            continue
        check = f"baseline regression: {output}" if output else "baseline regression"
        where = f"{output} " if output else ""
        message = (
            f"{check}: {where}{now.metric} {now.after:.4f} vs {then.after:.4f} before "
            f"(worse by {regression:.4f} > max {max_regression:.4f})"
        )
        item = item.with_status(Status.GATE_FAILED, message, check)
    return item


def _apply_baseline(items: list[BatchEntry], baseline: BatchSummary, max_regression: float) -> list[BatchEntry]:
    previous = {(m.name, m.policy): m for m in baseline.models}
    return [
        _with_baseline(item, old, max_regression) if (old := previous.get((item.name, item.policy))) else item
        for item in items
    ]


def finish(
    root: str,
    items: list[BatchEntry],
    elapsed: float,
    options: Any,
    workers: int,
    baseline: BatchSummary | None,
    finished: bool,
) -> BatchSummary:
    """batch.json's content; `finished` once every job of the run (or shard) has its outcome."""
    # In folder order, the same whatever the order of finishing or the sharding.
    items = sorted(items, key=lambda m: m.folder)
    if baseline:
        items = _apply_baseline(items, baseline, options.max_regression)
    models = tuple(items)
    return BatchSummary(
        root=str(root),
        shard=tuple(options.shard) if options.shard else None,
        shard_source=options.shard_source,
        finished=finished,
        jobs=workers,
        executor=options.executor,
        models=models,
        totals=Totals.of(models, elapsed),
    )


def write_batch(path: Path, summary: BatchSummary) -> None:
    text = json.dumps(summary.to_json(), indent=2, allow_nan=False) + "\n"
    replace_atomically(path, text, "the batch summary")


def read_batch(path: Path) -> BatchSummary:
    path = Path(path)
    if path.is_dir():
        path = path / BATCH_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise MpconvertError(f"{path} not found", hint="give a batch output root or its batch.json") from None
    except OSError as exc:
        raise MpconvertError(
            f"cannot read {path} ({exc})", hint="give the batch.json an mpconvert batch wrote"
        ) from None
    return parse_batch(text, path)


def parse_batch(text: str, where: str | Path) -> BatchSummary:
    """A batch.json's content, checked to be one (read from a file or from object storage)."""
    try:
        summary = json.loads(text)
    except ValueError as exc:
        raise MpconvertError(
            f"cannot read {where} ({exc})", hint="give the batch.json an mpconvert batch wrote"
        ) from None
    if not isinstance(summary, dict) or not isinstance(summary.get("models"), list):
        raise MpconvertError(
            f"{where} is not an mpconvert batch.json", hint="give the batch.json an mpconvert batch wrote"
        )
    check_version(summary, "batch summary", where, "give the batch.json an mpconvert batch of this version wrote")
    try:
        return BatchSummary.from_json(summary)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise MpconvertError(
            f"{where} is not an mpconvert batch.json (its entries lack {exc})",
            hint="give the batch.json an mpconvert batch wrote",
        ) from None


def merge(summaries: list[BatchSummary]) -> BatchSummary:
    """One summary from the shards' batch.json files, as if one run had done it all.

    Shards that shared one root merge into that root's summary; shards of
    separate roots keep each model's root.
    """
    roots = {s.root for s in summaries}
    shared = len(roots) == 1
    items: dict[str, BatchEntry] = {}
    for summary in summaries:
        for item in summary.models:
            if not shared:
                item = replace(item, root=item.root or summary.root)
            known = items.get(item.folder)
            if known and known.key != item.key:
                raise MpconvertError(
                    f"{item.folder} appears in two shards with different inputs",
                    hint="merge the shards of one batch run (the same manifest and options)",
                )
            items[item.folder] = item
    merged = tuple(sorted(items.values(), key=lambda m: m.folder))
    # Shards run side by side: the batch took as long as the slowest shard.
    elapsed = max((s.totals.elapsed_seconds for s in summaries), default=0.0)
    return BatchSummary(
        root=next(iter(roots)) if shared else None,
        shard=None,
        shard_source=None,
        finished=all(s.finished for s in summaries),
        shards=tuple(s.root for s in summaries),
        jobs=sum(s.jobs or 0 for s in summaries),
        models=merged,
        totals=Totals.of(merged, elapsed),
    )
