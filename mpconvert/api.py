"""The Python API: convert, inspect and check, for notebooks, scripts and batch workers.

The command line is a thin layer over these functions: both build their
options with `conversion_options` and run `pipeline`'s stages, so the same
inputs give the same report. Nothing here imports TensorFlow at import
time; the stages do, when they run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .options import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_LEARNING_RATE,
    DEFAULT_MAX_PAD_OVERHEAD,
    DEFAULT_OPSET,
    DEFAULT_PAD_MULTIPLE,
    DEFAULT_SEARCH_BUDGET,
    EXPORT_KINDS,
    AutoKeepOptions,
    ConvertOptions,
    ExportOptions,
    FinetuneOptions,
    GateOptions,
    LoadOptions,
    PadOptions,
    RewriteOptions,
    SaveOptions,
    ValidateOptions,
)

# A tolerance for every artifact kind, or one per kind: 1e-3 or {"onnx": 0.05}.
Tolerance = float | Mapping[str, float] | tuple[tuple[str | None, float], ...] | None


def _per_kind(value: Tolerance) -> tuple[tuple[str | None, float], ...]:
    if value is None:
        return ()
    if isinstance(value, (int, float)):
        return ((None, float(value)),)
    if isinstance(value, Mapping):
        return tuple((kind, float(x)) for kind, x in value.items())
    return tuple(value)


def gate_options(
    *,
    max_drop: float | None = None,
    min_agreement: float | None = None,
    atol: Tolerance = None,
    rtol: Tolerance = None,
    baseline: str | Path | None = None,
    max_regression: float | None = None,
    min_speedup: float | None = None,
) -> GateOptions:
    return GateOptions(
        max_drop=max_drop,
        min_agreement=min_agreement,
        atol=_per_kind(atol),
        rtol=_per_kind(rtol),
        max_regression=max_regression,
        baseline=Path(baseline) if baseline is not None else None,
        min_speedup=min_speedup,
    )


def conversion_options(
    model: Any,
    policy: str,
    *,
    data: Any = None,
    keep_float32: tuple[str, ...] | list[str] = (),
    metric: str | None = None,
    max_drop: float | None = None,
    min_agreement: float | None = None,
    atol: Tolerance = None,
    rtol: Tolerance = None,
    baseline: str | Path | None = None,
    max_regression: float | None = None,
    finetune_steps: int | None = None,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    batch_size: int = DEFAULT_BATCH_SIZE,
    loss: str | None = None,
    seed: int = 0,
    pad_multiple: int = DEFAULT_PAD_MULTIPLE,
    max_pad_overhead: float = DEFAULT_MAX_PAD_OVERHEAD,
    unsafe_deserialization: bool = False,
    imports: tuple[str, ...] | list[str] = (),
    custom_objects: Mapping[str, Any] | None = None,
    auto_keep: str = "search",
    search_budget: float = DEFAULT_SEARCH_BUDGET,
    min_speedup: float | None = None,
    speed: bool = True,
) -> ConvertOptions:
    """The one options object of a conversion, from the keywords the CLI and `convert` share."""
    return ConvertOptions(
        load=LoadOptions(model, unsafe_deserialization, tuple(imports), custom_objects),
        rewrite=RewriteOptions(policy, tuple(keep_float32)),
        validate=ValidateOptions(data=data, metric=metric, seed=seed),
        finetune=FinetuneOptions(finetune_steps, learning_rate, batch_size, seed, loss),
        pad=PadOptions(pad_multiple, max_pad_overhead),
        gate=gate_options(
            max_drop=max_drop,
            min_agreement=min_agreement,
            atol=atol,
            rtol=rtol,
            baseline=baseline,
            max_regression=max_regression,
            min_speedup=min_speedup,
        ),
        auto_keep=AutoKeepOptions(auto_keep, search_budget),
        speed=speed,
    )


class Conversion:
    """A converted model, in memory, with its report; `save` writes the artifacts."""

    def __init__(self, converted: Any):  # a pipeline.Converted
        self._converted = converted
        self._report = converted.report

    @property
    def model(self) -> Any:
        """The converted Keras model (padded where the proof passed), ready to predict."""
        return self._converted.model

    @property
    def report(self) -> dict:
        """The report, as report.json holds it (artifacts appear once saved)."""
        # Through JSON, so that it equals report.json exactly (lists, not tuples).
        return json.loads(json.dumps(self._report.as_dict(), allow_nan=False))

    @property
    def passed(self) -> bool:
        return self._report.passed

    @property
    def exit_code(self) -> int:
        return self._report.exit_code

    @property
    def layers(self) -> tuple:
        """Per-layer decisions: name, class_name, policy, and why a layer stayed float32."""
        return self._converted.plan.decisions

    def save(
        self,
        out: str | Path,
        export: tuple[str, ...] | list[str] = EXPORT_KINDS,
        *,
        force: bool = False,
        opset: int = DEFAULT_OPSET,
        bench_onnx: bool = False,
        on_stage: Callable[[str], None] | None = None,
    ) -> dict:
        """Write and re-check the artifacts into `out` (staged: whole or nothing); returns the final report.

        With bench_onnx, the ONNX file is also timed against a float32 export (one more export).
        """
        from .pipeline import save

        options = SaveOptions(Path(out), ExportOptions(tuple(export), opset, bench_onnx=bench_onnx), force)
        self._report, _ = save(self._converted, options, _hooks(on_stage, None))
        return self.report

    def __repr__(self) -> str:
        verdict = "passed" if self.passed else "failed"
        return f"<Conversion {self._report.source.get('name')!r} -> {self._report.policy}: {verdict}>"


def _hooks(on_stage, on_finetune_step):
    from .pipeline import Hooks

    return Hooks(stage=on_stage or (lambda name: None), finetune_step=on_finetune_step)


def convert(
    model: Any,
    policy: str,
    *,
    on_stage: Callable[[str], None] | None = None,
    on_finetune_step: Callable[[int, int, float, float | None], None] | None = None,
    **keywords: Any,
) -> Conversion:
    """Convert `model` (a path, or a live keras / tf_keras model, never modified) to `policy`.

    Keywords are the command line's options with underscores (data,
    keep_float32, max_drop, finetune_steps, pad_multiple, seed, ...; see
    `conversion_options`). Writes nothing, prints nothing, and leaves Keras's
    global policy as it found it; stages are logged on the "mpconvert"
    logger and reported to `on_stage(name)`, fine-tune steps to
    `on_finetune_step(step, total, loss, loss_scale)`. Raises MpconvertError
    for anything the inputs cause.
    """
    from .pipeline import convert as run

    options = conversion_options(model, policy, **keywords)
    return Conversion(run(options, _hooks(on_stage, on_finetune_step)))


@dataclass(frozen=True)
class Inspection:
    """What a conversion would do, per layer: policies and padding, nothing converted."""

    source: dict  # path, name, format, loader
    policy: str
    layers: tuple  # LayerDecision per layer, the lint's keeps included
    padding: Any  # a PadPlan, or None with pad_multiple=0
    lint: Any = None  # a lint.Lint: findings with their numbers (None with auto_keep="off")


def inspect(
    model: Any,
    policy: str = "mixed_float16",
    *,
    keep_float32: tuple[str, ...] | list[str] = (),
    pad_multiple: int = DEFAULT_PAD_MULTIPLE,
    max_pad_overhead: float = DEFAULT_MAX_PAD_OVERHEAD,
    unsafe_deserialization: bool = False,
    imports: tuple[str, ...] | list[str] = (),
    custom_objects: Mapping[str, Any] | None = None,
    data: Any = None,
    auto_keep: str = "search",
) -> Inspection:
    from .pipeline import inspect as plan

    options = conversion_options(
        model,
        policy,
        keep_float32=keep_float32,
        pad_multiple=pad_multiple,
        max_pad_overhead=max_pad_overhead,
        unsafe_deserialization=unsafe_deserialization,
        imports=imports,
        custom_objects=custom_objects,
        data=data,
        auto_keep=auto_keep,
    )
    found = plan(options)
    source = {
        "path": str(options.load.path) if options.load.path else None,
        "name": found.loaded.model.name,
        "format": found.loaded.format,
        "loader": found.loaded.framework.name,
    }
    return Inspection(source, policy, found.plan.decisions, found.padding, found.lint)


def check(report: dict | str | Path, **thresholds: Any) -> dict:
    """Re-apply the gate to a report (a dict, a report.json, or its folder); never imports TensorFlow.

    Thresholds not given (max_drop, min_agreement, atol, rtol, baseline,
    max_regression) keep the values stored in the report. Returns the
    re-judged report: its "passed" and "gate" are the new verdict.
    """
    from .gate import read_report

    stored = report if isinstance(report, dict) else read_report(Path(report))
    return recheck(stored, gate_options(**thresholds)).as_dict()


def recheck(stored: dict, options: GateOptions):
    """A stored report judged again with `options` over its own thresholds (a Report)."""
    from .gate import stored_thresholds
    from .report import Report

    thresholds = stored_thresholds(stored).overridden(options, stored["validation"]["metric"])
    return Report.from_dict(stored, thresholds)
