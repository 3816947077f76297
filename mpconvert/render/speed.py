"""The speed section in one line: the ratios against float32 per path, the serving percentiles, the fastest file."""

from __future__ import annotations

from collections.abc import Mapping

from mpconvert.render.common import finite
from mpconvert.report.report import Report
from mpconvert.report.sections import PathSpeed
from mpconvert.report.sections.speed import PERCENTILES


def speed_line(report: Report) -> str | None:
    """ "speed (CPU, batch 256): savedmodel 1.62x, keras 1.58x faster than float32; activations 0.50x (computed)".

    Speed ratios are float32 time / converted time (above 1 is faster), the
    activation memory's converted / float32 (below 1 is smaller). None for a
    report without a speed section.
    """
    if not report.speed:
        return None
    speed, notes = report.speed.measured, report.speed.notes
    ratios = {name: finite(path.ratio) for name, path in speed.paths.items()}
    timed = {name: r for name, r in ratios.items() if r is not None}
    text = f"speed ({speed.device.split(':')[0]}, batch {speed.batch}): "
    if timed:
        text += ", ".join(f"{name} {_ratio(r)}" for name, r in timed.items())
        text += " faster than float32" if min(timed.values()) > 1 else " float32's speed"
        text += " (slower)" if max(timed.values()) < 1 else ""
    served = _served(speed.paths)
    if served:
        text += f"; {served}"
    # Several files that serve it were timed (the Keras call serves nothing): the fastest, by name.
    served_by = {name: r for name, r in timed.items() if name != "keras"}
    if len(served_by) > 1:
        fastest = max(served_by, key=lambda name: served_by[name])
        text += f"; fastest here: {fastest} ({_ratio(served_by[fastest])} float32's speed)"
    if report.slow_kernel:  # a kernel far slower than float32: what was found, and what was done
        found = report.slow_kernel.found
        probed = "the kernel probe " if (found.what or "").startswith("one fused Dense") else ""
        took = f"{found.slower:g}x" if found.slower is not None else "far more than"
        text += f"; with default settings {probed}took {took} float32's time (see above)"
    elif timed and min(timed.values()) < 0.1:
        text += "; far slower than float32 here (see `mpconvert doctor` for the kernels this machine runs slowly)"
    if notes and notes.target_note:
        text += f"; {notes.target_note}"
    if notes and notes.padding and notes.padding.cost:
        text += f"; padded {notes.padding.cost:.2f}x the unpadded model's time here"
    untimed = [name for name, r in ratios.items() if r is None]
    if untimed:
        text += ("; " if timed else "") + f"{', '.join(untimed)} not timed (see report.json speed.paths)"
    memory = speed.memory
    if memory and finite(memory.ratio) is not None:
        text += f"; activations {memory.ratio:.2f}x ({memory.method.split()[0].rstrip(':')})"
    return text


def _served(paths: Mapping[str, PathSpeed]) -> str | None:
    """The converted model's latency percentiles and throughput on the serving paths: the SavedModel's (else the
    first) and the OpenVINO IR's where it was timed."""
    timed = {name: p.latency["converted"] for name, p in paths.items() if p.latency and p.latency.get("converted")}
    if not timed:
        return None
    names = ["savedmodel" if "savedmodel" in timed else next(iter(timed))]
    names += [name for name in ("openvino",) if name in timed and name not in names]
    found = []
    for name in names:
        t = timed[name]
        p50, p90, p99 = (t.percentile(q) for q in PERCENTILES)
        found.append(
            f"converted {name} p50/p90/p99 {p50:g}/{p90:g}/{p99:g} ms, {t.rows_per_s:,.0f} rows/s "
            f"({len(t.calls_ms)} calls)"
        )
    return "; ".join(found)


def _ratio(value: float) -> str:
    """1.62x, or 0.0015x: a ratio far below 1 keeps its figures, never reads 0.00x."""
    return f"{value:.2f}x" if value >= 0.01 else f"{value:.2g}x"
