"""The report: one object that owns the verdict, its JSON form and its terminal form.

The verdict is the gate's (gate.py), evaluated on the report's JSON form, so a
report rebuilt from report.json (`mpconvert check`) is judged exactly like
the run that wrote it. Exit codes live here so that every caller (CLI,
tests, batch runs) agrees on them.
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass, field, fields
from importlib import metadata
from pathlib import Path
from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .gate import PARITY, GateResult, Thresholds, evaluate

EXIT_OK = 0
EXIT_FAILED = 1  # the input or the conversion failed; nothing written
EXIT_USAGE = 2
EXIT_GATE = 3  # converted (or re-checked), but a gate check failed

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
    padding: dict | None = None  # the padding stage's result; None when it did not run
    artifacts: list[dict] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    versions: dict = field(default_factory=versions)
    out: str | None = None
    # None: the policy's defaults, with the budget the validation used.
    thresholds: Thresholds | None = None

    @classmethod
    def from_dict(cls, stored: dict, thresholds: Thresholds) -> "Report":
        """A report read back from report.json; `passed` and `gate` are recomputed."""
        known = {f.name for f in fields(cls)} - {"out", "thresholds"}
        return cls(**{k: v for k, v in stored.items() if k in known}, thresholds=thresholds)

    @property
    def gate(self) -> GateResult:
        thresholds = self.thresholds or Thresholds.defaults(self.policy, self.validation["max_drop"])
        return evaluate(self._body(), thresholds)

    @property
    def passed(self) -> bool:
        return self.gate.passed

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_GATE

    def _body(self) -> dict:
        return {
            "policy": self.policy,
            "source": self.source,
            "layers": self.layers,
            "finetune": self.finetune,
            "validation": self.validation,
            "padding": self.padding,
            "artifacts": self.artifacts,
            "versions": self.versions,
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
        }

    def as_dict(self) -> dict:
        gate = self.gate
        return {"passed": gate.passed, **self._body(), "gate": gate.as_dict()}

    def write(self, folder: Path) -> Path:
        path = folder / REPORT_NAME
        # allow_nan=False: a NaN in the report would make it invalid JSON for
        # every strict parser a CI system uses; stages store None instead.
        path.write_text(json.dumps(self.as_dict(), indent=2, allow_nan=False) + "\n")
        return path


def format_number(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def render_summary(report: dict, stream: IO[str] | None = None, report_path: Path | None = None) -> None:
    """The terminal summary of a report's JSON form (as written, or re-checked)."""
    stream = stream or sys.stdout
    # Piped output (CI logs) gets whole table rows rather than 80 columns.
    console = Console(file=stream, highlight=False, soft_wrap=True, width=None if stream.isatty() else 200)
    source, policy = report["source"], report["policy"]
    console.print(f"[bold]mpconvert[/] {source['path']} ({source['format']}, {source['loader']}) -> {policy}")
    mixed = sum(1 for layer in report["layers"] if layer["policy"] == policy)
    pinned = [layer for layer in report["layers"] if layer["pinned"] and layer["pinned"] != "input layer"]
    console.print(f"  layers: {mixed} converted to {policy}, {len(pinned)} kept float32")
    for layer in pinned[:8]:
        console.print(f"    {layer['name']} ({layer['class_name']}): {layer['pinned']}")
    if len(pinned) > 8:
        console.print(f"    ... and {len(pinned) - 8} more (see report.json)")
    if report["finetune"]:
        _render_finetune(console, report["finetune"])
    _render_validation(console, report["validation"])
    if report.get("padding"):
        _render_padding(console, report["padding"])
    gate = report["gate"]
    if report["artifacts"]:
        limits = parity_limits(gate)
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        for column in ("artifact", "path", "size", "max |diff|", "limit", "checked with"):
            table.add_column(column)
        for art in report["artifacts"]:
            table.add_row(
                art["kind"], art["path"], format_bytes(art["bytes"]), format_number(art["max_abs_diff"], 6),
                format_number(limits.get(art["kind"]), 6), art["runtime"],
            )  # fmt: skip
        console.print(table)
    for check in gate["checks"]:
        mark = "[green]pass[/]" if check["passed"] else "[bold red]FAIL[/]"
        console.print(f"  {mark} {check['name']}: {escape(check['message'])}")
    if report_path:
        console.print(f"  report: {report_path}")
    if gate["passed"]:
        console.print("[bold green]PASSED[/]")
    else:
        failed = ", ".join(check["name"] for check in gate["checks"] if not check["passed"])
        console.print(f"[bold red]FAILED[/]: {failed} (exit code {EXIT_GATE})")


def parity_limits(gate: dict) -> dict[str, float | None]:
    """Artifact kind -> the parity limit its check applied."""
    prefix = f"{PARITY}: "
    return {c["name"][len(prefix) :]: c["values"]["limit"] for c in gate["checks"] if c["name"].startswith(prefix)}


def _render_padding(console: Console, p: dict) -> None:
    dims = ", ".join(f"{d['layer']} {d['from']}->{d['to']}" for d in p["padded"][:6])
    more = f" and {len(p['padded']) - 6} more" if len(p["padded"]) > 6 else ""
    if p["exported"] == "padded":
        console.print(
            f"  padding to x{p['multiple']}: {dims}{more} (+{p['flops_overhead']:.1%} multiply-adds), "
            f"outputs unchanged (float32 max |diff| {format_number(p['float32_max_abs_diff'], 8)})"
        )
    elif not p["passed"]:
        console.print(f"  [bold yellow]padding not exported[/]: {p['reason']}")
    else:
        console.print(f"  padding to x{p['multiple']}: {p['reason']}")
    if p["skipped"]:
        console.print(f"    {len(p['skipped'])} dimension(s) left as they are (see report.json padding.skipped)")


def _render_finetune(console: Console, f: dict) -> None:
    scale = f["loss_scale"]
    scale_text = f", loss scale {scale['initial']:g} -> {scale['final']:g}" if scale else ""
    console.print(
        f"  fine-tune: {f['steps']} steps ({f['skipped_steps']} skipped{scale_text}), "
        f"{f['metric']} {format_number(f['metric_before'])} -> {format_number(f['metric_after'])}, kept {f['kept']} weights"
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
        before, after = format_number(v["reference"]), format_number(v["converted"])
        console.print(f"  {v['metric']} on {v['rows']} samples: {before} -> {after}")
    parts = []
    if v["agreement"] is not None:
        parts.append(f"predictions agree on {v['agreement']:.1%}")
    parts.append(f"max |diff| {format_number(v['max_abs_diff'], 6)}")
    console.print("  " + ", ".join(parts))
    if v.get("note") and v["metric"] is not None:
        console.print(f"  [yellow]{v['note']}[/]")
