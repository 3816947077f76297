"""batch.json: one entry per model and policy, totals, the verdict, and merging shards.

Pure functions over JSON, no TensorFlow: `batch-merge` and the summaries run
anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mpconvert.options.tolerance import within
from mpconvert.report.gate import layer_counts
from mpconvert.report.report import EXIT_FAILED, EXIT_GATE, EXIT_OK
from mpconvert.report.schema import SCHEMA_VERSION, check_version
from mpconvert.report.sections import Layer
from mpconvert.report.sections.validation import worse_by
from mpconvert.system.errors import MpconvertError
from mpconvert.system.writing import replace_atomically

BATCH_NAME = "batch.json"
STATUSES = ("passed", "gate_failed", "error", "timed_out")


def _base(job: Any, key: str, status: str, message: str, seconds: float) -> dict:
    return {
        "name": job.name,
        "path": job.given_path,
        "policy": job.policy,
        "status": status,
        "message": message,
        "folder": job.folder,
        "key": key,
        "reused": False,
        "seconds": round(seconds, 3),
        "metric": None,
        "before": None,
        "after": None,
        "drop": None,
        "kept_float32_share": None,
        "onnx_bytes": None,
        "onnx_vs_float32": None,
        "step_time_ratio": None,
        "failed_checks": [],
    }


def entry(job: Any, key: str, report: dict, status: str, message: str, seconds: float) -> dict:
    """A converted job's entry, its numbers taken from its report.json."""
    item = _base(job, key, status, message, seconds)
    v = report["validation"]
    share = layer_counts(report["policy"], [Layer.from_json(layer) for layer in report["layers"]]).kept_share
    onnx = next((a for a in report["artifacts"] if a["kind"] == "onnx" and not a.get("failed")), None)
    parameters = report["source"].get("parameters")
    item.update(
        metric=v["metric"],
        before=v["reference"],
        after=v["converted"],
        drop=v["drop"],
        kept_float32_share=round(share, 4) if share is not None else None,
        # float32 weights take 4 bytes a parameter: the size the file would have in float32.
        onnx_bytes=onnx["bytes"] if onnx else None,
        onnx_vs_float32=round(onnx["bytes"] / (4 * parameters), 4) if onnx and parameters else None,
        step_time_ratio=(report.get("finetune") or {}).get("step_time_ratio"),
        failed_checks=[c["name"] for c in report["gate"]["checks"] if not c["passed"]],
    )
    if v.get("outputs"):  # several outputs: each scored one's numbers, by name
        item["outputs"] = [
            {
                "name": o["name"],
                "metric": o["metric"],
                "before": o["reference"],
                "after": o["converted"],
                "drop": o["drop"],
            }
            for o in v["outputs"]
            if o["metric"] is not None
        ]
    return item


def reused_entry(job: Any, key: str, report: dict) -> dict:
    """A result found complete under the same key (--resume): not converted again."""
    status = "passed" if report["passed"] else "gate_failed"
    item = entry(job, key, report, status, "", 0.0)
    item.update(reused=True, message="" if report["passed"] else "failed: " + ", ".join(item["failed_checks"]))
    return item


def failed_entry(job: Any, key: str, status: str, message: str, seconds: float) -> dict:
    return _base(job, key, status, message, seconds)


def _apply_baseline(items: list[dict], baseline: dict, max_regression: float) -> None:
    """The single-model baseline rule (gate.py's: worse_by, then within), per model and output: no worse than before."""
    previous = {(m["name"], m["policy"]): m for m in baseline["models"]}
    for item in items:
        old = previous.get((item["name"], item["policy"]))
        if not old:
            continue
        pairs = [(None, old, item)]
        if item.get("outputs"):  # several outputs: each against the same output before
            before = {o["name"]: o for o in old.get("outputs") or []}
            pairs = [(o["name"], before.get(o["name"]), o) for o in item["outputs"]]
        for output, was, now in pairs:
            if not was or was.get("after") is None or now["after"] is None or was["metric"] != now["metric"]:
                continue
            regression = worse_by(now["metric"], was["after"], now["after"])
            now["baseline"] = {"after": was["after"], "regression": round(regression, 6)}
            if not within(regression, max_regression) and item["status"] == "passed":
                check = f"baseline regression: {output}" if output else "baseline regression"
                where = f"{output} " if output else ""
                item["status"] = "gate_failed"
                item["failed_checks"] = [*item["failed_checks"], check]
                item["message"] = (
                    f"{check}: {where}{now['metric']} {now['after']:.4f} vs {was['after']:.4f} before "
                    f"(worse by {regression:.4f} > max {max_regression:.4f})"
                )


def totals(items: list[dict], elapsed: float) -> dict:
    counts = {status: sum(1 for m in items if m["status"] == status) for status in STATUSES}
    converted = sum(1 for m in items if not m["reused"] and m["status"] in ("passed", "gate_failed"))
    return {
        **counts,
        "models": len(items),
        "reused": sum(1 for m in items if m["reused"]),
        "elapsed_seconds": round(elapsed, 3),
        "models_per_minute": round(converted / (elapsed / 60), 3) if elapsed > 0 and converted else None,
    }


def exit_code(items: list[dict]) -> int:
    statuses = {m["status"] for m in items}
    if statuses & {"error", "timed_out"}:
        return EXIT_FAILED
    return EXIT_GATE if "gate_failed" in statuses else EXIT_OK


def finish(
    root: str, items: list[dict], elapsed: float, options: Any, workers: int, baseline: dict | None, finished: bool
) -> dict:
    """batch.json's content; `finished` once every job of the run (or shard) has its outcome."""
    # In folder order, the same whatever the order of finishing or the sharding.
    items = sorted(items, key=lambda m: m["folder"])
    if baseline:
        _apply_baseline(items, baseline, options.max_regression)
    return {
        "schema_version": SCHEMA_VERSION,
        "root": str(root),
        "shard": list(options.shard) if options.shard else None,
        "shard_source": options.shard_source,
        "finished": finished,
        "jobs": workers,
        "executor": options.executor,
        "models": items,
        "totals": totals(items, elapsed),
        "exit_code": exit_code(items),
        "passed": exit_code(items) == EXIT_OK,
    }


def write_batch(path: Path, summary: dict) -> None:
    replace_atomically(path, json.dumps(summary, indent=2, allow_nan=False) + "\n", "the batch summary")


def read_batch(path: Path) -> dict:
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


def parse_batch(text: str, where: str | Path) -> dict:
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
    return summary


def merge(summaries: list[dict]) -> dict:
    """One summary from the shards' batch.json files, as if one run had done it all.

    Shards that shared one root merge into that root's summary; shards of
    separate roots keep each model's root.
    """
    roots = {s["root"] for s in summaries}
    shared = len(roots) == 1
    items: dict[str, dict] = {}
    for summary in summaries:
        for item in summary["models"]:
            if not shared:
                item = {**item, "root": item.get("root", summary["root"])}
            known = items.get(item["folder"])
            if known and known["key"] != item["key"]:
                raise MpconvertError(
                    f"{item['folder']} appears in two shards with different inputs",
                    hint="merge the shards of one batch run (the same manifest and options)",
                )
            items[item["folder"]] = item
    merged = sorted(items.values(), key=lambda m: m["folder"])
    # Shards run side by side: the batch took as long as the slowest shard.
    elapsed = max((s["totals"]["elapsed_seconds"] for s in summaries), default=0.0)
    return {
        "schema_version": SCHEMA_VERSION,
        "root": next(iter(roots)) if shared else None,
        "shard": None,
        "shard_source": None,
        "finished": all(s.get("finished", True) for s in summaries),
        "shards": [s["root"] for s in summaries],
        "jobs": sum(s["jobs"] for s in summaries),
        "models": merged,
        "totals": totals(merged, elapsed),
        "exit_code": exit_code(merged),
        "passed": exit_code(merged) == EXIT_OK,
    }
