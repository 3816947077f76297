"""Every human- and CI-facing rendering of mpconvert's results, in one place.

This module: single reports (terminal, JUnit, Markdown), inspect tables and
progress; `batch.py` the fleet view of a batch; `doctor.py` the doctor's table.

The terminal summary, the `inspect` tables, JUnit XML and the Markdown
summary. All but the inspect tables render a `report.Report` (as a
conversion made it, or as `mpconvert check` read it back and re-judged it),
one line, test case or table row per gate check, so what a person or a CI
page sees is what decided the exit code. Nothing here decides anything, and
nothing here reads JSON: a figure that is not finite shows as report.json
holds it, n/a.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO, Any

from junitparser import Failure, JUnitXml, TestCase, TestSuite
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mpconvert.data.formats import ModelFormat, known_format, units_of
from mpconvert.data.rows import Overlap
from mpconvert.render.batch import BatchProgress, batch_markdown, batch_totals_line, render_batch, write_batch_junit
from mpconvert.render.common import (
    Live,
    artifact_path,
    console_for,
    finite,
    format_bytes,
    format_number,
    inner_lines,
    row,
    token_line,
)
from mpconvert.render.doctor import render_doctor, render_model_timing
from mpconvert.render.figures import check_figures, parity_limit
from mpconvert.render.speed import speed_line
from mpconvert.report.checks import PARITY
from mpconvert.report.gate import GateResult, layer_counts
from mpconvert.report.report import EXIT_GATE, Report
from mpconvert.report.sections import (
    AutoKeep,
    Fidelity,
    Finetune,
    OutputValidation,
    PaddingReport,
    Source,
    Validation,
)
from mpconvert.report.sections.details import OnnxDetails, OpenVinoDetails
from mpconvert.report.sections.validation import Measured
from mpconvert.system.hooks import Hooks

__all__ = [
    "BatchProgress",
    "LiveDisplay",
    "batch_markdown",
    "batch_totals_line",
    "describe_source",
    "format_bytes",
    "format_number",
    "junit_xml",
    "markdown",
    "render_batch",
    "render_doctor",
    "render_model_timing",
    "render_inspection",
    "render_summary",
    "speed_line",
    "write_batch_junit",
    "write_junit",
]

NOT_WRITTEN = "(not written)"  # an artifact whose export failed
LOADER_NAMES = {"keras": "Keras 3", "tf_keras": "tf-keras"}


def describe_source(source: Source) -> str:
    """ "model.keras (.keras file, Keras 3)": what was converted, and by which Keras."""
    what = source.path or f"model {source.name!r}"
    known = known_format(source.format)
    kind = known.description if known else source.format  # a format newer than this version: its name
    return f"{what} ({kind}, {LOADER_NAMES.get(source.loader, source.loader)})"


# --- the terminal -------------------------------------------------------------


def render_summary(report: Report, stream: IO[str] | None = None, report_path: Path | str | None = None) -> None:
    """The terminal summary of a report (as a conversion made it, or re-checked)."""
    console = console_for(stream or sys.stdout)
    console.print(f"[bold]mpconvert[/] {describe_source(report.source)} -> {report.policy}")
    counts = layer_counts(report.policy, report.layers)
    pinned = counts.kept
    units = units_of(report.source.format)
    console.print(f"  {units}: {counts.converted} converted to {report.policy}, {len(pinned)} kept float32")
    for layer in pinned[:8]:
        console.print(f"    {layer.name} ({layer.class_name}): {layer.pinned}")
    if len(pinned) > 8:
        console.print(f"    ... and {len(pinned) - 8} more (see report.json)")
    for line in inner_lines(report.layers):
        console.print(f"    {escape(line)}")
    if report.fidelity:
        console.print(f"  rebuild: {escape(fidelity_line(report.fidelity, report.source.format))}")
    if report.auto_keep:
        _render_auto_keep(console, report.auto_keep)
    if report.finetune:
        _render_finetune(console, report.finetune)
    _render_validation(console, report.validation)
    if report.padding:
        _render_padding(console, report.padding)
    if report.slow_kernel:
        console.print(f"  [bold yellow]slow kernel[/]: {escape(report.slow_kernel.summary)}")
    speed = speed_line(report)
    if speed:
        console.print(f"  {escape(speed)}")
    gate = report.gate
    if report.artifacts:
        limits = parity_limits(gate)
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        for column in ("artifact", "path", "size", "max |diff|", "limit", "checked with"):
            table.add_column(column)
        for art in report.artifacts:
            if art.failed:  # the reason is in its parity check below
                table.add_row(
                    str(art.kind),
                    NOT_WRITTEN,
                    "-",
                    "not exportable" if art.exportable is False else "[bold red]failed[/]",
                    format_number(limits.get(art.kind), 6),
                    "-",
                )
                continue
            table.add_row(
                str(art.kind),
                artifact_path(art),
                format_bytes(art.bytes),
                format_number(art.max_abs_diff, 6),
                format_number(limits.get(art.kind), 6),
                art.runtime,
            )
        console.print(table)
        for art in report.artifacts:
            emulated = art.details.emulated_16bit_ops if isinstance(art.details, OnnxDetails) else None
            if emulated:
                console.print(
                    f"  [yellow]{art.path} did not run as written[/]: this ONNX Runtime has no "
                    f"{report.policy.split('_')[-1]} kernel for {', '.join(emulated[:6])}"
                    f"{' and more' if len(emulated) > 6 else ''}; it was checked on a copy that computes those "
                    "ops in float32 and rounds back (see docs/report.md: Which runtimes run the 16-bit ONNX files)"
                )
            ran = _openvino_note(art.details) if isinstance(art.details, OpenVinoDetails) else None
            if ran:
                console.print(f"  [yellow]{art.path} {escape(ran)}[/]")
    for check in gate.checks:
        mark = "[green]pass[/]" if check.passed else "[bold red]FAIL[/]"
        console.print(f"  {mark} {check.name}: {escape(check.message)}")
        console.print(f"       [dim]{escape(check_figures(check))}[/]")
    if report_path:
        console.print(f"  report: {report_path}")
        page = Path(report_path).with_name("report.html")
        if isinstance(report_path, Path) and page.is_file():  # in object storage (a URL) it is beside it too
            console.print(f"  page: {page}")
    if gate.passed:
        console.print("[bold green]PASSED[/]")
    else:
        failed = ", ".join(check.name for check in gate.failed)
        console.print(f"[bold red]FAILED[/]: {failed} (exit code {EXIT_GATE})")


def fidelity_line(fidelity: Fidelity, model_format: str | None) -> str:
    """What the float32 proof found, from its figures: it claims a reproduction only where they show one."""
    what, of = (known_format(model_format) or ModelFormat.KERAS).proof
    diff, limit, rows = finite(fidelity.max_abs_diff), finite(fidelity.limit), fidelity.rows
    if not rows:
        return f"{what} was not compared with {of}: no rows"
    if diff is None or limit is None:
        return (
            f"{what} against {of}: max |diff| {format_number(diff, 6)}, limit {format_number(limit, 6)} on {rows} rows"
        )
    if diff > limit:
        return f"{what} differs from {of}: max |diff| {diff:.3g} > {limit:.3g} on {rows} rows"
    return f"{what} reproduces {of} (max |diff| {diff:.3g} <= {limit:.3g} on {rows} rows)"


def parity_limits(gate: GateResult) -> dict[str, float | None]:
    """Artifact kind -> the parity limit its check applied."""
    prefix = f"{PARITY}: "
    return {c.name[len(prefix) :]: parity_limit(c) for c in gate.checks if c.name.startswith(prefix)}


def _render_padding(console: Console, p: PaddingReport) -> None:
    dims = ", ".join(f"{d.layer} {d.width}->{d.to}" for d in p.padded[:6])
    more = f" and {len(p.padded) - 6} more" if len(p.padded) > 6 else ""
    if p.exported == "padded":
        console.print(
            f"  padding to x{p.multiple}: {dims}{more} (+{p.flops_overhead:.1%} multiply-adds), "
            f"outputs unchanged (float32 max |diff| {format_number(p.float32_max_abs_diff, 8)})"
        )
    elif not p.passed:
        console.print(f"  [bold yellow]padding not exported[/]: {p.reason}")
    else:
        console.print(f"  padding to x{p.multiple}: {p.reason}")
    if p.skipped:
        console.print(f"    {len(p.skipped)} dimension(s) left as they are (see report.json padding.skipped)")


_SEARCH_OUTCOMES = {
    "passed": "the gate's accuracy and agreement checks pass",
    "budget": "stopped at --search-budget with a passing set that may not be the smallest",
    "share": "no set within half of the layers passes; the gate fails with the full conversion",
}


def _render_auto_keep(console: Console, auto: AutoKeep) -> None:
    lint, search = auto.lint, auto.search
    if lint and lint.findings:
        console.print(
            f"  numeric lint on {lint.rows} rows: {len(lint.findings)} finding(s); "
            f"kept float32: {', '.join(sorted(lint.keep))}"
        )
    if search:
        kept = ", ".join(search.kept) or "nothing"
        console.print(
            f"  search: {search.trials} trials in {search.seconds:.1f} s, kept {kept}: "
            f"{_SEARCH_OUTCOMES.get(search.outcome, search.outcome)}"
        )


def _openvino_note(details: OpenVinoDetails) -> str | None:
    """An OpenVINO IR that does not compute in the converted model's 16-bit type here: the fallback, by name."""
    if details.fallback:
        return f"asks {details.precision} (fallback): {details.fallback}"
    if details.ran_precision and details.precision and details.ran_precision != details.precision:
        return (
            f"asks {details.precision} and ran {details.ran_precision} on {', '.join(details.execution_devices or ())}"
        )
    return None


def _render_finetune(console: Console, f: Finetune) -> None:
    scale = f.loss_scale
    scale_text = f", loss scale {scale.initial:g} -> {scale.final:g}" if scale else ""
    console.print(
        f"  fine-tune: {f.steps} steps ({f.skipped_steps} skipped{scale_text}), "
        f"{f.metric} {format_number(f.metric_before)} -> {format_number(f.metric_after)}, kept {f.kept} weights"
    )
    if f.step_time_ratio is not None:
        st = f.step_time
        console.print(
            f"    train step {st.converted_ms:.1f} ms vs float32 {st.float32_ms:.1f} ms (x{f.step_time_ratio:.2f})"
        )
    if not f.healthy:
        console.print(f"  [bold yellow]fine-tune stopped[/]: {f.problem}; the weights from before it were kept")
        console.print(f"    try: {f.advice}")


def _render_validation(console: Console, v: Validation) -> None:
    if v.outputs:
        for o in v.outputs:
            _render_output(console, o)
    elif v.metric is None:
        console.print(f"  [yellow]accuracy not measured[/]: no --data given; output drift on {v.rows} generated inputs")
    else:
        before, after = format_number(v.reference), format_number(v.converted)
        console.print(f"  {v.metric} on {v.rows} samples: {before} -> {after}")
    if not v.outputs:
        if v.tokens:
            console.print(f"  {escape(token_line(v.tokens))}")
        console.print("  " + ", ".join(_comparison(v)))
    if v.note and v.metric is not None:
        console.print(f"  [yellow]{v.note}[/]")
    overlap = v.overlap
    if overlap and (overlap.in_train or overlap.duplicates_within_validation):
        console.print(f"  [yellow]{escape(overlap_line(overlap))}[/]")
    if v.unread_keys:
        keys = ", ".join(map(repr, v.unread_keys))
        console.print(f"  [yellow]warning: not read: {escape(keys)}, neither inputs nor labels of this model[/]")


def overlap_line(overlap: Overlap) -> str:
    """What the leakage check found, in one line (the gate fails it only when fine-tuning trained on it)."""
    parts = []
    if overlap.in_train:
        parts.append(
            f"{overlap.in_train} of {overlap.validation_rows} validation rows ({overlap.share:.1%}) "
            "are also training rows"
        )
    if overlap.duplicates_within_validation:
        parts.append(f"{overlap.duplicates_within_validation} validation rows repeat other validation rows")
    return "warning: " + "; ".join(parts) + " (exact copies over every input)"


def _comparison(v: Measured) -> list[str]:
    parts = []
    agreement = finite(v.agreement)
    if agreement is not None:
        harm = _harm(v, 1)
        parts.append(f"predictions agree on {agreement:.1%}" + (f" ({harm})" if harm else ""))
    parts.append(f"max |diff| {format_number(v.max_abs_diff, 6)}")
    return parts


def _render_output(console: Console, o: OutputValidation) -> None:
    """One output of a multi-output model: its metric (or that it has no labels) and its drift."""
    if o.metric is None:
        head = "no labels (drift only)"
    else:
        head = f"{o.metric} {format_number(o.reference)} -> {format_number(o.converted)}"
    if o.tokens:
        head += f"; {escape(token_line(o.tokens))}"
    console.print(f"  output {o.name}: {head}; " + ", ".join(_comparison(o)))


def _harm(v: Measured, digits: int) -> str | None:
    """ "3 harmed, 8 fixed: kept 99.3% of the 440 rows the float32 model got
    right" (what the agreement check judges with labels), or None without."""
    if v.harmed is None:
        return None
    text = f"{v.harmed} harmed, {v.fixed} fixed"
    kept = finite(v.kept_correct)
    if kept is not None:
        unit = "tokens" if v.tokens else "rows"  # a sequence output counts tokens
        text += f": kept {kept:.{digits}%} of the {v.kept_correct_rows} {unit} the float32 model got right"
    return text


def render_inspection(inspection: Any, stream: IO[str] | None = None) -> None:
    """`mpconvert inspect`: the per-layer (or per-node) policy table, then the padding table."""
    console = console_for(stream or sys.stdout)
    unit = units_of(inspection.described.format)[:-1]
    table = Table(title=f"{describe_source(inspection.described)} -> {inspection.policy}")
    for column in (unit, "class", "policy", "kept float32 because"):
        table.add_column(column, no_wrap=True)
    padding = inspection.padding
    for d in inspection.layers:
        inside = getattr(d, "inside", None)
        why = d.pinned or (f"[dim]inside {escape(inside)}[/]" if inside else "")
        table.add_row(escape(d.name), d.class_name, d.policy or "-", why)
    console.print(table)
    lint = getattr(inspection, "lint", None)
    if lint is not None and lint.findings:
        table = Table(title=f"Numeric lint on {lint.rows} rows: what {inspection.policy} would break")
        for column in (unit, "finding", "numbers"):
            table.add_column(column, no_wrap=True)
        for f in lint.findings:
            table.add_row(f.layer, f.kind, f.message)
        console.print(table)
    if padding is None:
        return
    table = Table(
        title=f"Tensor-Core padding to multiples of {padding.multiple} (+{padding.flops_overhead:.1%} multiply-adds)"
    )
    for column in ("layer", "dimension", "now", "padded to", "or not, because"):
        table.add_column(column, no_wrap=True)
    for d in padding.padded:
        table.add_row(d.layer, d.dim, str(d.width), str(d.to), "")
    for s in padding.skipped:
        table.add_row(s.layer, s.dim, str(s.width), "", s.reason)
    if not padding.padded and not padding.skipped:
        table.add_row("(every dimension is already a multiple)", "", "", "", "")
    console.print(table)


# --- progress while converting --------------------------------------------------


class LiveDisplay(Live):
    """Stage names and a fine-tuning progress bar."""

    def hooks(self) -> Hooks:
        if not self.progress:
            if self.quiet:
                return Hooks()
            return Hooks(warning=self._warn, note=self._note)
        return Hooks(stage=self._stage, finetune_step=self._step, warning=self._warn, note=self._note)

    def _warn(self, text: str) -> None:
        """Before converting: said on stderr, also when not on a terminal (CI logs keep it)."""
        console = self.progress.console if self.progress else Console(stderr=True, highlight=False, soft_wrap=True)
        console.print(f"[yellow]warning:[/] {escape(text)}")

    def _note(self, text: str) -> None:
        """After the output is written (the MLflow run): on stderr, as the warnings."""
        console = self.progress.console if self.progress else Console(stderr=True, highlight=False, soft_wrap=True)
        console.print(escape(text))

    def _stage(self, name: str) -> None:
        if self.task is not None:  # the fine-tune bar is done once the next stage starts
            self.progress.remove_task(self.task)
            self.task = None
        self.progress.console.print(f"[dim]... {name}[/]")

    def _step(self, step: int, total: int, loss: float, scale: float | None) -> None:
        if self.task is None:
            self.task = self.progress.add_task("fine-tune", total=total, detail="")
        detail = f"loss {loss:.4f}" + (f"  scale {scale:g}" if scale is not None else "")
        self.progress.update(self.task, completed=step, detail=detail)


# --- CI systems ---------------------------------------------------------------


def _model_name(report: Report) -> str:
    source = report.source
    if not source.path:
        return source.name or "model"
    return Path(source.path).name or source.path


def junit_xml(report: Report) -> JUnitXml:
    """One test suite for the run, one test case per gate check."""
    model, policy = _model_name(report), report.policy
    suite = TestSuite(f"mpconvert: {model} -> {policy}")
    suite.add_property("model", report.source.path or _model_name(report))
    suite.add_property("policy", policy)
    # Reporters group test cases by class name; dots read as a test path.
    classname = f"mpconvert.{model.replace('.', '_')}.{policy}"
    for check in report.gate.checks:
        case = TestCase(check.name, classname, 0.0)
        if check.passed:
            case.system_out = check.message
        else:
            # The message is what reporters show in one line; the text keeps
            # every number the check used.
            failure = Failure(check.message, "mpconvert.gate")
            failure.text = f"{check.name}: {check.message}\n{json.dumps(check.to_json()['values'], indent=2)}"
            case.result = [failure]
        suite.add_testcase(case)
    suite.time = round(sum(report.timings.seconds().values()), 3)
    xml = JUnitXml("mpconvert")
    xml.add_testsuite(suite)
    return xml


def write_junit(report: Report, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    junit_xml(report).write(str(path), pretty=True)


def markdown(report: Report) -> str:
    """A summary for a CI job page: metric, budget, artifacts and every check."""
    gate, v, policy = report.gate, report.validation, report.policy
    thresholds = gate.thresholds
    verdict = "✅ PASSED" if gate.passed else "❌ FAILED"
    lines = [f"## mpconvert: {_model_name(report)} → {policy}: {verdict}", ""]
    if v.metric is None:
        lines += [
            f"**Accuracy not measured**: no labelled data; output drift only "
            f"(max abs diff {format_number(v.max_abs_diff, 6)} on {v.rows} generated inputs).",
            "",
        ]
    else:
        lines += [
            row("metric", "float32", policy, "drop", "budget"),
            "| --- | ---: | ---: | ---: | ---: |",
            row(
                f"{v.metric} ({v.rows} samples)",
                format_number(v.reference),
                format_number(v.converted),
                format_number(v.drop),
                format_number(thresholds.max_drop),
            ),
            "",
        ]
    facts = []
    agreement = finite(v.agreement)
    if agreement is not None:
        rule = ", ".join(filter(None, (_harm(v, 2), f"min {thresholds.min_agreement:.2%}")))
        facts.append(f"Predictions agree on {agreement:.2%} ({rule}).")
    if v.nonfinite_outputs:
        where = ", ".join(f"{n} in `{name}`" for name, n in (v.nonfinite_by_output or {}).items())
        facts.append(f"**{v.nonfinite_outputs} NaN/inf output values{f' ({where})' if where else ''}.**")
    tuning = report.finetune
    if tuning:
        state = "healthy" if tuning.healthy else f"**stopped**: {tuning.problem}"
        facts.append(
            f"Fine-tune: {tuning.steps} of {tuning.requested_steps} steps, {state}, kept {tuning.kept} weights."
        )
    speed = speed_line(report)
    if speed:
        facts.append(speed[0].upper() + speed[1:] + ".")
    baseline = thresholds.baseline
    if baseline:
        facts.append(f"Baseline: {baseline.metric} {format_number(baseline.converted)} from `{baseline.path}`.")
    if facts:
        lines += [" ".join(facts), ""]
    if report.artifacts:
        limits = parity_limits(gate)
        lines += [
            row("artifact", "size", "max abs diff", "limit", "checked with"),
            "| --- | ---: | ---: | ---: | --- |",
        ]
        for art in report.artifacts:
            found = finite(art.max_abs_diff)
            diff = "NaN/inf" if found is None else f"{found:.3g}"
            known = limits.get(art.kind)
            limit = "n/a" if known is None else f"{known:.3g}"
            if art.failed:
                verdict = "not exportable" if art.exportable is False else "❌ **failed**"
                lines.append(row(f"{art.kind} {NOT_WRITTEN}", "-", verdict, limit, art.reason))
                continue
            lines.append(row(f"{art.kind} (`{artifact_path(art)}`)", format_bytes(art.bytes), diff, limit, art.runtime))
        lines.append("")
    lines += [row("check", "result", "details", "figures"), "| --- | --- | --- | --- |"]
    for check in gate.checks:
        verdict = "✅ pass" if check.passed else "❌ **fail**"
        lines.append(row(check.name, verdict, check.message, check_figures(check)))
    return "\n".join(lines) + "\n"
