"""The fleet view of a batch: terminal table, Markdown, JUnit, and its progress display."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, Any

from junitparser import Error, Failure, JUnitXml, TestCase, TestSuite
from rich.markup import escape
from rich.table import Table

from mpconvert.render.common import Live, cell, console_for, finite, format_number, row
from mpconvert.report.batch import BatchEntry, BatchSummary, Status

# --- batches ------------------------------------------------------------------

_STATUS_MARK = {
    "passed": "[green]passed[/]",
    "gate_failed": "[bold red]gate failed[/]",
    "error": "[bold red]error[/]",
    "timed_out": "[bold red]timed out[/]",
}


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"x{value:.2f}"


def _batch_row(m: BatchEntry) -> list[str]:
    drop = finite(m.drop)
    return [
        m.name,
        m.policy,
        m.status + (" (reused)" if m.reused else ""),
        f"{format_number(m.before)} -> {format_number(m.after)}",
        "n/a" if drop is None else f"{drop:+.4f}",
        _share(m.kept_float32_share),
        _ratio(m.onnx_vs_float32),
        _ratio(finite(m.step_time_ratio)),
        f"{m.seconds:.1f}",
    ]


_BATCH_COLUMNS = ("model", "policy", "status", "metric", "drop", "kept fp32", "onnx/fp32", "step time", "s")


def batch_totals_line(summary: BatchSummary) -> str:
    t = summary.totals
    rate = "n/a" if t.models_per_minute is None else f"{t.models_per_minute:.2f}"
    return (
        f"{t.models} model/policy runs: {t.passed} passed, {t.gate_failed} failed the gate, "
        f"{t.error} errors, {t.timed_out} timed out, {t.reused} reused; "
        f"{t.elapsed_seconds:.0f} s, {rate} models per minute with {summary.jobs} at once"
    )


def render_batch(summary: BatchSummary, stream: IO[str] | None = None, path: Path | None = None) -> None:
    """The fleet view: one row per model and policy, the problems, the totals."""
    console = console_for(stream or sys.stdout)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in _BATCH_COLUMNS:
        table.add_column(column)
    for m in summary.models:
        cells = _batch_row(m)
        cells[2] = _STATUS_MARK[m.status] + (" (reused)" if m.reused else "")
        table.add_row(*[cells[0], cells[1], cells[2], *map(escape, cells[3:])])
    console.print(table)
    for m in summary.models:
        if m.message:
            console.print(f"  {escape(m.name + ' [' + m.policy + ']')}: {escape(m.message)}")
    console.print("  " + batch_totals_line(summary))
    if path:
        console.print(f"  batch: {path}")
        page = Path(str(path)).with_name("index.html")
        if "://" not in str(path) and page.is_file():
            console.print(f"  page: {page}")
    verdict = {0: "[bold green]PASSED[/]", 3: "[bold red]FAILED[/] (exit code 3: gate)"}
    console.print(verdict.get(summary.exit_code, "[bold red]FAILED[/] (exit code 1: errors or timeouts)"))


def batch_markdown(summary: BatchSummary) -> str:
    verdict = "✅ PASSED" if summary.passed else "❌ FAILED"
    lines = [f"## mpconvert batch: {verdict}", "", batch_totals_line(summary) + ".", ""]
    lines += [row(*_BATCH_COLUMNS), "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [row(*_batch_row(m)) for m in summary.models]
    problems = [m for m in summary.models if m.message]
    if problems:
        lines += ["", *[f"- **{cell(m.name)} [{m.policy}]**: {cell(m.message)}" for m in problems]]
    return "\n".join(lines) + "\n"


def write_batch_junit(summary: BatchSummary, path: Path) -> None:
    """One test case per model and policy: a gate failure is a failure, an error or timeout an error."""
    suite = TestSuite("mpconvert batch")
    for m in summary.models:
        case = TestCase(f"{m.name} [{m.policy}]", f"mpconvert.batch.{m.name.replace('.', '_')}", m.seconds)
        if m.status == Status.GATE_FAILED:
            case.result = [Failure(m.message, "mpconvert.gate")]
        elif m.status in (Status.ERROR, Status.TIMED_OUT):
            case.result = [Error(m.message, f"mpconvert.{m.status}")]
        else:
            case.system_out = f"{m.metric} {format_number(m.before)} -> {format_number(m.after)}"
        suite.add_testcase(case)
    suite.time = summary.totals.elapsed_seconds
    xml = JUnitXml("mpconvert")
    xml.add_testsuite(suite)
    path.parent.mkdir(parents=True, exist_ok=True)
    xml.write(str(path), pretty=True)


class BatchProgress(Live):
    """Models done / failed / running, elapsed and an estimate of the rest."""

    stderr = True  # stdout may carry --json

    def __init__(self, quiet: bool, total: int = 0):
        super().__init__(quiet)
        self.total = total
        self.counts = {"done": 0, "failed": 0, "running": 0}

    def columns(self) -> list:
        from rich.progress import TextColumn, TimeRemainingColumn

        return [*super().columns(), TextColumn("eta"), TimeRemainingColumn()]

    def event(self, kind: str, job: Any, item: BatchEntry | None) -> None:
        if kind == "started":
            self.counts["running"] += 1
        elif kind in ("finished", "reused"):
            self.counts["running"] -= kind == "finished"
            self.counts["done"] += 1
            self.counts["failed"] += item is not None and item.status != Status.PASSED
        if not self.progress:
            return
        if self.task is None:
            self.task = self.progress.add_task("batch", total=self.total or None, detail="")
        c = self.counts
        self.progress.update(
            self.task, completed=c["done"], detail=f"{c['failed']} failed, {c['running']} running ({job.label})"
        )
