"""An earlier run's report.json read back: for `mpconvert check`, `--baseline` and the API's `check`.

No TensorFlow: a re-check takes a fraction of a second. A file that is not
an mpconvert report, or one of a schema version this mpconvert does not
know, is refused with a message naming the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mpconvert.options.gate import DEFAULT_MAX_DROP, Baseline, Thresholds
from mpconvert.options.precision import POLICIES
from mpconvert.report.schema import check_version
from mpconvert.report.sections import Validation
from mpconvert.system.errors import MpconvertError

# What makes a JSON file an mpconvert report: the keys the gate reads.
_REPORT_KEYS = ("policy", "source", "layers", "validation", "artifacts")
_VALIDATION_KEYS = (
    "metric",
    "reference",
    "converted",
    "drop",
    "agreement",
    "max_abs_diff",
    "rows",
    "nonfinite_outputs",
)


def report_file(path: Path) -> Path:
    """The report.json that `path` names: itself, or the one in the output folder it names."""
    path = Path(path)
    return path / "report.json" if path.is_dir() and (path / "report.json").is_file() else path


def read_report(path: Path, role: str = "report") -> dict:
    """A report.json (or the output folder holding one) as a dict, or a clear error."""
    path = report_file(path)
    hint = "give the report.json that an mpconvert run wrote into its output folder"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise MpconvertError(f"{role} {path} not found", hint=hint) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MpconvertError(f"cannot read {role} {path}: {exc}", hint=hint) from None
    try:
        report = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MpconvertError(f"{role} {path} is not valid JSON ({exc})", hint=hint) from None
    missing = [key for key in _REPORT_KEYS if key not in report] if isinstance(report, dict) else list(_REPORT_KEYS)
    if not missing and isinstance(report["validation"], dict):
        missing = [f"validation.{key}" for key in _VALIDATION_KEYS if key not in report["validation"]]
    if missing:
        raise MpconvertError(f"{role} {path} is not an mpconvert report (it has no {', '.join(missing)})", hint=hint)
    check_version(report, role, path, hint)
    if report["policy"] not in POLICIES:
        raise MpconvertError(f"{role} {path} has an unknown policy {report['policy']!r}", hint=hint)
    return report


def load_baseline(path: Path, measured: Mapping[str, str] | str | None) -> Baseline:
    """An earlier run's numbers, refused unless they measure what this run measures.

    `measured` is this run's metric per labelled output. With several
    outputs each is compared with the baseline's output of the same name.
    """
    if not isinstance(measured, Mapping):  # one output's metric, or None
        measured = {"output": measured} if measured else {}
    report = read_report(path, "baseline")
    v = Validation.from_json(report["validation"])
    if v.metric is None or v.converted is None:
        raise MpconvertError(
            f"baseline {path} measured no metric (that run had no labelled --data)",
            hint="use as baseline a run with --data, like this one",
        )
    if not measured:
        raise MpconvertError(
            "--baseline compares metrics, but this run measures none (no labelled data)",
            hint="pass --data with labels, as the baseline run did",
        )
    # Metrics as report.json spells them: the baseline is stored in this run's report.
    outputs = {
        o.name: {"metric": str(o.metric), "converted": o.converted}
        for o in v.outputs or ()
        if o.metric is not None and o.converted is not None
    }
    before = outputs or {name: {"metric": str(v.metric)} for name in list(measured)[:1]}
    for name, metric in measured.items():
        old = before.get(name, {}).get("metric")
        if old is not None and old != metric:
            where = f" for output {name!r}" if len(measured) > 1 else ""
            raise MpconvertError(
                f"baseline {path} measured {old}{where}, this run measures {metric}: they cannot be compared",
                hint=f"compare runs that measure the same metric (--metric {old} on both)",
            )
    model = report["source"].get("path", "")
    return Baseline(str(path), str(v.metric), v.converted, report["policy"], model, outputs or None)


def stored_thresholds(report: Mapping[str, Any]) -> Thresholds:
    """The thresholds a stored report was judged by.

    A report without a gate section gets its policy's defaults and the budget
    its validation used.
    """
    stored = report.get("gate", {}).get("thresholds")
    if stored is None:
        # Reports from before the gate section kept the budget with the validation.
        return Thresholds.defaults(report["policy"], report["validation"].get("max_drop", DEFAULT_MAX_DROP))
    try:
        return Thresholds.from_dict(stored)
    except (TypeError, AttributeError) as exc:
        raise MpconvertError(
            f"the report's gate.thresholds cannot be read ({exc})",
            hint="restore the report.json as mpconvert wrote it, or rerun the conversion",
        ) from None
