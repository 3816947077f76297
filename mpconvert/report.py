"""The report: one object that owns the verdict, its JSON form and its terminal form.

Exit codes live here so that every caller (CLI, tests, batch runs) agrees on
them.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.table import Table

EXIT_OK = 0
EXIT_FAILED = 1  # the input or the conversion failed
EXIT_USAGE = 2
EXIT_GATE = 3  # converted, but a check (accuracy budget) failed

REPORT_NAME = "report.json"
_DISTRIBUTIONS = {
    "tensorflow": ("tensorflow", "tensorflow-cpu"),
    "keras": ("keras",),
    "tf_keras": ("tf-keras", "tf_keras"),
    "tf2onnx": ("tf2onnx",),
    "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime-gpu", "onnxruntime"),
}


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for key, names in _DISTRIBUTIONS.items():
        found[key] = None
        for name in names:
            try:
                found[key] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    return found


@dataclass
class Report:
    policy: str
    source: dict
    layers: list[dict]
    validation: dict
    finetune: dict | None = None
    artifacts: list[dict] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    versions: dict = field(default_factory=versions)
    out: str | None = None

    @property
    def passed(self) -> bool:
        return bool(self.validation.get("passed"))

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_GATE

    def as_dict(self) -> dict:
        return {
            "passed": self.passed,
            "policy": self.policy,
            "source": self.source,
            "layers": self.layers,
            "finetune": self.finetune,
            "validation": self.validation,
            "artifacts": self.artifacts,
            "versions": self.versions,
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
        }

    def write(self, folder: Path) -> Path:
        path = folder / REPORT_NAME
        # allow_nan=False: a NaN in the report would make it invalid JSON for
        # every strict parser a CI system uses; stages store None instead.
        path.write_text(json.dumps(self.as_dict(), indent=2, allow_nan=False) + "\n")
        return path


def _fmt(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def render_summary(report: Report, stream: IO[str] | None = None) -> None:
    console = Console(file=stream, highlight=False, soft_wrap=True)
    source = report.source
    console.print(f"[bold]mpconvert[/] {source['path']} ({source['format']}, {source['loader']}) -> {report.policy}")
    mixed = sum(1 for layer in report.layers if layer["policy"] == report.policy)
    pinned = [layer for layer in report.layers if layer["pinned"] and layer["pinned"] != "input layer"]
    console.print(f"  layers: {mixed} converted to {report.policy}, {len(pinned)} kept float32")
    for layer in pinned[:8]:
        console.print(f"    {layer['name']} ({layer['class_name']}): {layer['pinned']}")
    if len(pinned) > 8:
        console.print(f"    ... and {len(pinned) - 8} more (see report.json)")
    if report.finetune:
        _render_finetune(console, report.finetune)
    _render_validation(console, report.validation)
    if report.artifacts:
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        for column in ("artifact", "path", "size", "max |diff|", "checked with"):
            table.add_column(column)
        for art in report.artifacts:
            table.add_row(art["kind"], art["path"], _bytes(art["bytes"]), _fmt(art["max_abs_diff"], 6), art["runtime"])
        console.print(table)
    if report.out:
        console.print(f"  report: {Path(report.out) / REPORT_NAME}")
    verdict = "[bold green]PASSED[/]" if report.passed else "[bold red]FAILED[/] (accuracy gate, exit code 3)"
    console.print(verdict)


def _render_finetune(console: Console, f: dict) -> None:
    scale = f["loss_scale"]
    scale_text = f", loss scale {scale['initial']:g} -> {scale['final']:g}" if scale else ""
    console.print(
        f"  fine-tune: {f['steps']} steps ({f['skipped_steps']} skipped{scale_text}), "
        f"{f['metric']} {_fmt(f['metric_before'])} -> {_fmt(f['metric_after'])}, kept {f['kept']} weights"
    )
    if f["step_time_ratio"] is not None:
        st = f["step_time"]
        console.print(
            f"    train step {st['converted_ms']:.1f} ms vs float32 {st['float32_ms']:.1f} ms "
            f"(x{f['step_time_ratio']:.2f})"
        )
    if not f["healthy"]:
        console.print(f"  [bold yellow]fine-tune stopped[/]: {f['problem']}; the weights from before it were kept")
        console.print(f"    try: {f['advice']}")


def _render_validation(console: Console, v: dict) -> None:
    if v["metric"] is None:
        console.print(f"  [yellow]accuracy not measured[/]: no --data given; output drift on {v['rows']} generated inputs")
    else:
        sign = "<=" if v["passed"] else ">"
        console.print(
            f"  {v['metric']} on {v['rows']} samples: {_fmt(v['reference'])} -> {_fmt(v['converted'])}, "
            f"drop {_fmt(v['drop'])} {sign} max {_fmt(v['max_drop'])}"
        )
    parts = []
    if v["agreement"] is not None:
        parts.append(f"predictions agree on {v['agreement']:.1%}")
    parts.append(f"max |diff| {_fmt(v['max_abs_diff'], 6)}")
    console.print("  " + ", ".join(parts))
    if v.get("note") and v["metric"] is not None:
        console.print(f"  [yellow]{v['note']}[/]")


def load_report(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
