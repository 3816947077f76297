"""report.html and a batch's index.html: one self-contained page each, from the JSON mpconvert wrote.

The report page renders a `report.Report` like every other rendering here
(the templates read its sections, and the JSON form of the few parts whose
figures are derived), so `mpconvert check --html` on an old report.json
shows what the run showed. Jinja2 templates with autoescaping (model and
layer names are user data); the charts are inline SVG whose geometry is
worked out here, so the templates only place shapes. No network: no scripts, fonts or images
from elsewhere, and the pages read the same without JavaScript (the batch
page's sorting is the only script).
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from jinja2 import ChainableUndefined, Environment, PackageLoader

from mpconvert.data.formats import units_of
from mpconvert.options.gate import Thresholds
from mpconvert.options.validate import Metric
from mpconvert.render import describe_source, parity_limits, speed_line
from mpconvert.render.common import finite, format_bytes, format_number, token_line
from mpconvert.render.figures import check_figures
from mpconvert.report.batch import BatchSummary
from mpconvert.report.checks import PARITY
from mpconvert.report.gate import GateResult, layer_counts
from mpconvert.report.report import Report
from mpconvert.report.sections import Validation, member
from mpconvert.report.sections.validation import Measured
from mpconvert.system.writing import replace_atomically

REPORT_HTML = "report.html"
INDEX_HTML = "index.html"


@functools.cache
def _templates() -> Environment:
    environment = Environment(
        loader=PackageLoader("mpconvert.render", "templates"),
        autoescape=True,
        # Reports from older runs or other paths lack some fields: those render empty.
        undefined=ChainableUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(number=format_number, size=format_bytes, percent=_percent, figures=check_figures)
    return environment


def _percent(value: float | None, digits: int = 1) -> str:
    value = finite(value)
    return "n/a" if value is None else f"{value:.{digits}%}"


# --- charts: geometry for the templates' SVG ----------------------------------------


@dataclass
class Chart:
    """A horizontal bar chart or a line chart, in SVG user units."""

    title: str
    width: int
    height: int
    bars: list[dict] = field(default_factory=list)  # x, y, w, h, label, text, kind
    lines: list[dict] = field(default_factory=list)  # x1, y1, x2, y2, label, kind
    paths: list[dict] = field(default_factory=list)  # points, label, kind (a polyline)
    labels: list[dict] = field(default_factory=list)  # x, y, text, anchor


_LABEL_W, _BAR_W, _TEXT_W, _ROW = 190, 360, 90, 22


def bar_chart(
    title: str, rows: list[tuple[str, float | None, str]], reference: tuple[float, str] | None = None
) -> Chart:
    """One bar per (label, value, kind); a dashed line at `reference` (value, label), e.g. float32's 1.0x."""
    values = [v for _, v, _ in rows if v is not None and math.isfinite(v)]
    top = max([*values, reference[0] if reference else 0.0, 1e-12]) * 1.1
    chart = Chart(title, _LABEL_W + _BAR_W + _TEXT_W, len(rows) * _ROW + 30)
    for i, (label, value, kind) in enumerate(rows):
        y = 8 + i * _ROW
        known = value is not None and math.isfinite(value)
        w = max(1.0, _BAR_W * max(value, 0.0) / top) if value is not None and known else 0.0
        text = f"{value:.4g}" if known else "n/a"
        chart.bars.append(
            {"x": _LABEL_W, "y": y, "w": round(w, 1), "h": _ROW - 6, "label": label, "text": text, "kind": kind}
        )
    if reference:
        x = round(_LABEL_W + _BAR_W * reference[0] / top, 1)
        chart.lines.append(
            {"x1": x, "y1": 2, "x2": x, "y2": len(rows) * _ROW + 8, "label": reference[1], "kind": "ref"}
        )
    return chart


def higher_is_better(metric: str) -> bool:
    known = member(Metric, metric)  # a metric this version does not know: lower is better, as worse_by reads it
    return isinstance(known, Metric) and known.higher_is_better


def metric_charts(report: Report, budgets: Mapping[str | None, float | None]) -> list[Chart]:
    """Per scored output: float32's and the converted metric, and the worst value its budget allows."""
    v = report.validation
    outputs: list[Measured] = [o for o in v.outputs or () if o.metric is not None]
    names: list[str | None] = [o.name for o in v.outputs or () if o.metric is not None]
    scored = list(zip(names, outputs)) or ([(None, v)] if v.metric is not None else [])
    charts = []
    for name, o in scored:
        budget = budgets.get(name, budgets.get(None))
        limit = None
        reference = finite(o.reference)
        if budget is not None and reference is not None and o.metric is not None:
            # accuracy may fall by the budget, mse and cross-entropy may rise by it (sections.validation.worse_by)
            limit = reference - budget if higher_is_better(o.metric) else reference + budget
        rows = [("float32", reference, "before"), (report.policy, finite(o.converted), "after")]
        where = f"output {name}: " if name else ""
        title = f"{where}{o.metric} before and after" + (f" (budget {budget:g})" if budget is not None else "")
        line = (limit, f"limit {limit:.4g}") if limit is not None and limit > 0 else None
        charts.append(bar_chart(title, rows, line))
    return charts


def step_ticks(first: int, last: int, most: int = 6) -> list[int]:
    """Up to `most` step numbers for an x axis: the first, round ones between (1, 2 or 5 x 10^k apart), the last."""
    span = last - first
    if span <= 0:
        return [first]
    raw = span / (most - 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    stride = max(1, int(next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)))
    # Round ones not crowding the ends: a label needs half a stride of room.
    between = range((first // stride + 1) * stride, last, stride)
    return [first, *(t for t in between if min(t - first, last - t) >= stride / 2), last]


def line_chart(
    title: str, xs: list[int], ys: list[float | None], kind: str, log: bool = False, held: bool = False
) -> Chart | None:
    """A polyline of ys over the steps xs they were recorded at; gaps where a value is not finite.

    `log`: a log2 y axis (a loss scale moves by factors of two). `held`: the
    value holds until the next record (a staircase), as a loss scale does.
    None with under two points.
    """
    points = [(x, y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y) and (y > 0 or not log)]
    if len(points) < 2:
        return None
    # The right margin leaves room for the last step's number centred on its tick
    # ("step 100" centred at 630 of 640 units showed as "step 1").
    width, height, left, right, bottom = 640, 180, 70, 40, 24
    values = [math.log2(y) if log else y for _, y in points]
    low, high = min(values), max(values)
    if high == low:  # a constant series sits mid-chart, not under the x axis
        pad = 1.0 if log else abs(low) / 2 or 1.0
        low, high = low - pad, high + pad
    x0, x1 = points[0][0], points[-1][0]
    xspan = (x1 - x0) or 1

    def at(x: float, value: float) -> tuple[float, float]:
        px = left + (width - left - right) * (x - x0) / xspan
        py = 10 + (height - bottom - 18) * (1 - (value - low) / (high - low))  # the lowest 8 above the axis
        return round(px, 1), round(py, 1)

    corners = list(zip((x for x, _ in points), values))
    if held:  # across to the next step at the old value, then to the new one
        stairs = [c for (x, v), (nx, _) in zip(corners, corners[1:]) for c in ((x, v), (nx, v))] + corners[-1:]
        corners = [c for i, c in enumerate(stairs) if i == 0 or c != stairs[i - 1]]
    chart = Chart(title, width, height)
    chart.paths.append(
        {"points": " ".join(f"{px},{py}" for px, py in (at(x, v) for x, v in corners)), "label": title, "kind": kind}
    )
    text = (lambda value: f"{2**value:g}") if log else (lambda value: f"{value:.4g}")
    # The values the series took where they are few (a loss scale's), else its extremes.
    distinct = sorted(set(values))
    for value in distinct if len(distinct) <= 4 else [min(values), max(values)]:
        _, py = at(x0, value)
        chart.labels.append({"x": left - 6, "y": py + 4, "text": text(value), "anchor": "end"})
    for x in step_ticks(x0, x1):
        px, _ = at(x, low)
        chart.labels.append({"x": px, "y": height - 6, "text": str(x), "anchor": "middle"})
    chart.labels.append({"x": left - 16, "y": height - 6, "text": "step", "anchor": "end"})
    chart.lines.append(
        {"x1": left, "y1": height - bottom, "x2": width - right, "y2": height - bottom, "label": "", "kind": "axis"}
    )
    return chart


# --- the conversion report ------------------------------------------------------


def _budgets(thresholds: Thresholds) -> dict[str | None, float | None]:
    """Output name (None for a single output, and the default) -> the drop its metric check allows."""
    budgets: dict[str | None, float | None] = {None: thresholds.max_drop}
    budgets.update(thresholds.max_drop_by_output)
    return budgets


def _layers(report: Report) -> list[dict]:
    """The per-layer table: the plan, each layer's lint findings and its search sensitivity."""
    auto = report.auto_keep
    findings: dict[str, list[str]] = {}
    for f in auto.lint.findings if auto and auto.lint else ():
        findings.setdefault(f.layer, []).append(f"{f.kind}: {f.message}")
    ranking = auto.search.ranking if auto and auto.search else ()
    sensitivity = {r.layer: finite(r.sensitivity) for r in ranking}
    rows = []
    for layer in report.layers:
        name = layer.name
        rows.append(
            {
                **layer.to_json(),
                "findings": findings.get(name, []),
                # A split head's 16-bit part (NAME_linear) is ranked under the original name.
                "sensitivity": sensitivity.get(name, sensitivity.get(name.removesuffix("_linear"))),
            }
        )
    return rows


def _speed(report: Report) -> dict | None:
    if not report.speed:
        return None
    speed = report.speed.measured
    rows = [(name, finite(p.ratio), "after") for name, p in speed.paths.items()]
    return {
        "line": speed_line(report),
        # The table reads each path's figures as report.json holds them (percentiles and throughput derived).
        "paths": {name: p.to_json() for name, p in speed.paths.items()},
        "chart": bar_chart("speed against float32 (above 1 is faster)", rows, (1.0, "float32")) if rows else None,
        "memory": speed.memory,
    }


def _finetune(report: Report) -> dict | None:
    tuning = report.finetune
    if not tuning:
        return None
    history = tuning.history
    steps = list(history.step) if history else []
    losses = list(history.loss) if history else []
    scales: list[float | None] = list(history.loss_scale or ()) if history else []
    charts = [
        line_chart("fine-tune loss over the steps", steps, losses, "loss"),
        line_chart("loss scale over the steps (log)", steps, scales, "scale", log=True, held=True),
    ]
    return {**tuning.to_json(), "charts": [c for c in charts if c is not None]}


def _artifacts(report: Report, gate: GateResult) -> list[dict]:
    limits = parity_limits(gate)
    checks = {c.name: c for c in gate.checks}
    model = report.provenance.model if report.provenance else None
    original = model.bytes if model else None
    return [
        {
            **a.to_json(),
            "limit": limits.get(a.kind),
            "check": checks.get(f"{PARITY}: {a.kind}"),
            "of_original": a.bytes / original if original and a.bytes else None,
        }
        for a in report.artifacts
    ]


def _title(report: Report) -> str:
    source = report.source
    model = Path(source.path).name if source.path else source.name or "model"
    return f"{model} → {report.policy}"


def report_page(report: Report) -> str:
    """report.html's text for a report (as a conversion made it, or as `mpconvert check` re-judged it)."""
    gate = report.gate
    counts = layer_counts(report.policy, report.layers)
    auto = report.auto_keep
    ranking = auto.search.ranking if auto and auto.search else ()
    sensitivity = (
        bar_chart(
            "per-layer sensitivity (the search's ranking: accuracy lost with only this layer in 16 bits)",
            [(r.layer, finite(r.sensitivity), "sensitivity") for r in ranking],
        )
        if ranking
        else None
    )
    timings = report.timings.seconds()
    budgets = _budgets(gate.thresholds)
    return (
        _templates()
        .get_template("report.html.j2")
        .render(
            title=_title(report),
            report=report,
            source=describe_source(report.source),
            gate=gate,
            failed=[c.name for c in gate.failed],
            counts=counts,
            layers=_layers(report),
            units=units_of(report.source.format).capitalize(),
            auto=auto,
            sensitivity=sensitivity,
            metric_charts=metric_charts(report, budgets),
            budgets=budgets,
            validation=report.validation,
            token_lines=_token_lines(report.validation),
            speed=_speed(report),
            finetune=_finetune(report),
            padding=report.padding,
            # Nothing padded: no proof ran, and the page must not claim one.
            padding_compared=report.padding is not None and report.padding.compared,
            artifacts=_artifacts(report, gate),
            timings=timings,
            timing_chart=bar_chart("seconds per stage", [(k, v, "time") for k, v in timings.items()])
            if timings
            else None,
            total_seconds=sum(timings.values()),
            versions=report.versions.to_json(),
            provenance=report.provenance,
        )
    )


def _token_lines(v: Validation) -> list[str]:
    """What each sequence output scored: its tokens, the padding left out, cross-entropy and perplexity."""
    if not v.outputs:
        return [token_line(v.tokens)] if v.tokens else []
    return [f"output {o.name}: {token_line(o.tokens)}" for o in v.outputs if o.tokens]


def write_report_page(report: Report, path: Path) -> Path:
    """Write report.html (whole or not at all: a full disk is a WriteError naming the path)."""
    replace_atomically(Path(path), report_page(report), "the HTML report")
    return Path(path)


# --- the batch page ----------------------------------------------------------------


def _bar(drop: float | None, budget: float | None) -> dict | None:
    """The drop as a share of its budget, for the row's bar (capped at 150% so a bad one stays on the page)."""
    if drop is None or budget is None:
        return None
    share = (max(drop, 0.0) / budget) if budget > 0 else (0.0 if drop <= 0 else 1.5)
    return {"share": share, "width": round(min(share, 1.5) / 1.5 * 120, 1), "over": drop > budget}


@dataclass(frozen=True)
class _FromReport:
    """What batch.json leaves out and the page shows: the drop's budget and the serving speed-up."""

    max_drop: float | None = None
    speedup: float | None = None


def _from_report(folder: Path) -> _FromReport:
    try:
        report = Report.from_json(json.loads((folder / "report.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError):  # an error or timeout leaves no folder: the row says so itself
        return _FromReport()
    paths = report.speed.paths if report.speed else {}
    timed = paths.get("savedmodel") or next(iter(paths.values()), None)
    return _FromReport(report.thresholds.max_drop, finite(timed.ratio) if timed else None)


def batch_rows(summary: BatchSummary, folder: Path) -> list[dict]:
    """One row per model and policy, each linking to its report.html (relative, so the root can move).

    A converted model (passed or failed the gate) has a folder with its
    page; an error or a timeout has none. Its budget and speed-up come
    from its report.json where that is on this disk (an object-storage
    root keeps them only in the bucket: n/a there).
    """
    rows = []
    for m in summary.models:
        root = str(m.root or summary.root or folder)
        if "://" in root:  # object storage: the page is in the bucket, beside batch.json
            link = f"{m.folder}/{REPORT_HTML}" if m.converted else None
            found = _FromReport()
        else:
            base = Path(root) / m.folder
            link = Path(os.path.relpath(base / REPORT_HTML, folder)).as_posix() if m.converted else None
            found = _from_report(base)
        bar = _bar(finite(m.drop), found.max_drop)
        rows.append({**m.to_json(), "max_drop": found.max_drop, "speedup": found.speedup, "link": link, "bar": bar})
    return rows


def batch_page(summary: BatchSummary, folder: Path) -> str:
    """index.html's text for a batch summary (one run, a shard or merged shards) kept in `folder`."""
    from mpconvert.render.batch import batch_totals_line

    return (
        _templates()
        .get_template("batch.html.j2")
        .render(
            title="mpconvert batch",
            summary=summary,
            totals=batch_totals_line(summary),
            rows=batch_rows(summary, Path(folder)),
        )
    )


def write_batch_page(summary: BatchSummary, folder: Path) -> Path:
    path = Path(folder) / INDEX_HTML
    replace_atomically(path, batch_page(summary, Path(folder)), "the batch page")
    return path


__all__ = [
    "INDEX_HTML",
    "REPORT_HTML",
    "batch_page",
    "report_page",
    "write_batch_page",
    "write_report_page",
]
