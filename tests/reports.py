"""Hand-written reports and thresholds, with numbers chosen to make the checks easy to compute by hand."""

import json
from pathlib import Path

from mpconvert.options.gate import Thresholds
from mpconvert.report.report import Report


def make_report(**changes) -> dict:
    """A report as a conversion writes it (without `passed` and `gate`).

    The numbers are chosen to make the thresholds below easy to compute by
    hand. `changes` replaces top-level keys; `validation` entries merge.
    """
    report = {
        "policy": "mixed_float16",
        "source": {
            "path": "models/net.keras",
            "name": "net",
            "format": "keras",
            "loader": "keras",
            "inputs": [],
            "outputs": [],
        },
        "layers": [
            {"name": "features", "class_name": "InputLayer", "policy": "float32", "pinned": "input layer"},
            {"name": "hidden", "class_name": "Dense", "policy": "mixed_float16", "pinned": None},
            {"name": "predictions_linear", "class_name": "Dense", "policy": "mixed_float16", "pinned": None},
            {"name": "predictions", "class_name": "Activation", "policy": "float32", "pinned": "model output"},
        ],
        "finetune": None,
        "validation": {
            "metric": "accuracy",
            "reference": 0.962,
            "converted": 0.948,
            "drop": 0.962 - 0.948,  # 0.014000000000000012 in binary
            "max_drop": 0.01,
            "passed": False,
            "agreement": 0.98,
            "max_abs_diff": 0.002,
            "data": "npz",
            "rows": 500,
            "nonfinite_outputs": 0,
            "note": None,
        },
        "padding": None,
        "artifacts": [
            {
                "kind": "savedmodel",
                "path": "savedmodel",
                "bytes": 2048,
                "max_abs_diff": 0.0,
                "max_abs_ref": 2.0,
                "runtime": "tensorflow",
                "details": {},
                "failed": False,
                "reason": None,
            },
            {
                "kind": "onnx",
                "path": "model.onnx",
                "bytes": 1024,
                "max_abs_diff": 0.004,
                "max_abs_ref": 2.0,
                "runtime": "onnxruntime",
                "details": {},
                "failed": False,
                "reason": None,
            },
        ],
        "versions": {"python": "3.11"},
        "timings": {"load": 1.0, "export": 2.5},
    }
    validation = changes.pop("validation", {})
    report["validation"].update(validation)
    report.update(changes)
    return report


def thresholds(**changes) -> Thresholds:
    base = Thresholds(
        max_drop=0.005,
        min_agreement=0.95,
        atol={"savedmodel": 0.001, "keras": 0.001, "onnx": 0.001},
        rtol={"savedmodel": 0.0, "keras": 0.0, "onnx": 0.0015},
        max_regression=0.0,
    )
    return Thresholds(**{**base.__dict__, **changes})


def write(path: Path, content) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def typed(report: dict, th: Thresholds | None = None) -> Report:
    """A hand-written report as the gate judges it: its typed sections, judged by `th` (default: its policy's)."""
    return Report.from_json(report, th or Thresholds.defaults(report["policy"], report["validation"]["max_drop"]))


def stored(report: dict, th: Thresholds | None = None) -> dict:
    """The report as report.json holds it, judged by `th` (default: its policy's)."""
    return typed(report, th).to_json()
