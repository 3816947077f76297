"""The one place where the stage order lives.

load -> rewrite -> finetune -> validate -> pad, in memory (`convert`), then
export -> report into a staged output folder (`save`). Each stage is a
function with explicit inputs that returns a result object; this module only
wires them together and times them. The CLI, the Python API and batch
workers all run these functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import interrupts
from .artifacts import estimated_bytes, export_all, export_graph, graph_bytes
from .configs import model_class, model_config
from .context import Context
from .data import EvalData, Task, evaluation_data
from .finetune import StepCallback, finetune
from .frozen.freeze import FrozenGraph, is_graph_savedmodel
from .frozen.pipeline import LIMITS, convert_graph
from .load import Loaded, load_model
from .numerics.autokeep import AutoKeep, keep_by_lint, keep_by_search, passes
from .options import PARITY_SAMPLES, ConvertOptions, RewriteOptions, SaveOptions
from .outdir import claimed_output, staged_output
from .pad import PadPlan, pad, plan_model_padding
from .report import Report, json_safe
from .rewrite import Plan, output_activation, plan_conversion, rewrite
from .signature import Signature, refuse_string_inputs, signature_of
from .speed import (
    SPEED_BATCH,
    Speed,
    measure_onnx_speed,
    measure_speed,
    padding_cost,
    probe_hardware,
    target_note,
    warning_for,
)
from .speed.slow_kernel import guard
from .trace import output_layers
from .validate import judging, validate
from .writing import reported_at, write_text, writing

log = logging.getLogger("mpconvert")


@dataclass(frozen=True)
class Hooks:
    """How a caller watches a run: stage starts and fine-tune steps."""

    stage: Callable[[str], None] = lambda name: None
    finetune_step: StepCallback | None = None
    # Said before converting, e.g. that float16 cannot be fast on this CPU.
    warning: Callable[[str], None] = lambda text: None
    # Whether the caller can run itself again with oneDNN's rewrites off
    # (speed.slow_kernel.Restart): the command line and batch workers can.
    may_restart: bool = False


@dataclass
class _Clock:
    hooks: Hooks
    timings: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        interrupts.check()
        log.info("stage %s", name)
        self.hooks.stage(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            # A stage that runs again (the rewrite after a search) adds up.
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start


@dataclass(frozen=True)
class Converted:
    """An in-memory conversion: the model to export and its report so far (no artifacts)."""

    model: Any  # padded when the padding proof passed, else the rewritten model
    plan: Plan
    context: Context
    loaded: Loaded
    report: Report
    inputs: tuple[Path, ...]  # files the run read, which no output may overwrite
    speed_batch: int = SPEED_BATCH  # the serving batch the speed stage (and --bench-onnx) time at


def _kind(activation: str | None) -> str:
    if activation in ("softmax", "log_softmax"):
        return "softmax"
    return "sigmoid" if activation == "sigmoid" else "regression"


def _activation_of(layer: Any) -> str | None:
    if layer is None:
        return None
    if type(layer).__name__ == "Softmax":
        return "softmax"
    activation = getattr(layer, "activation", None)  # a function on a live layer
    return activation if isinstance(activation, str) else getattr(activation, "__name__", None)


def tasks_of(model: Any, signature: Signature) -> tuple[Task, ...]:
    """What each output means (softmax, sigmoid or regression), in the signature's order."""
    if len(signature.outputs) == 1:
        return (Task(_kind(output_activation(model_config(model), model_class(model))), signature.outputs[0]),)
    layers = output_layers(model)
    return tuple(Task(_kind(_activation_of(layer)), spec) for layer, spec in zip(layers, signature.outputs))


def read_files(options: ConvertOptions, data: EvalData | None = None) -> tuple[Path, ...]:
    """The files a run reads (model, data file): outputs must leave them alone."""
    files = [options.load.path] if options.load.path else []
    if data is not None and data.source == "npz" and data.path:
        files.append(Path(data.path))
    elif isinstance(options.validate.data, (str, Path)) and Path(options.validate.data).exists():
        files.append(Path(options.validate.data))
    return tuple(files)


@dataclass(frozen=True)
class Inspection:
    loaded: Loaded
    plan: Plan
    padding: PadPlan | None
    lint: Any = None  # the numeric lint's findings (None with --auto-keep off)


def inspect(options: ConvertOptions) -> Inspection:
    """The per-layer policy, lint and padding plans, without converting or writing anything.

    The lint runs the float32 model on the data (else generated inputs), as a
    conversion does, and its keeps are in the plan. Padding is planned on the
    rewritten model, as the conversion does: a softmax split off an output
    layer changes what can be padded.
    """
    loaded = load_model(options.load)
    framework = loaded.framework
    signature = signature_of(loaded.model)
    refuse_string_inputs(loaded.model, signature)
    rewrite_options, found = options.rewrite, None
    with framework.preserved_global_policy(), loaded.deserialization():
        tasks = tasks_of(loaded.model, signature)
        data = evaluation_data(loaded.model, signature, tasks, options.validate, options.seed)
        if options.auto_keep.mode != "off":
            metrics = ("accuracy",) * len(tasks)
            context = Context(loaded.model, framework, signature, tasks, metrics, data, options.precision)
            found, rewrite_options = keep_by_lint(context, rewrite_options)
        if not options.pad.multiple:
            plan = plan_conversion(model_config(loaded.model), model_class(loaded.model), rewrite_options)
            return Inspection(loaded, plan, None, found)
        rewritten = rewrite(loaded.model, framework, rewrite_options, proof_rows(data))
        padding = plan_model_padding(rewritten.model, framework, options.pad)
    return Inspection(loaded, rewritten.plan, padding, found)


def proof_rows(data: EvalData) -> list:
    """The validation rows the rebuild and padding proofs run on."""
    return [x[:PARITY_SAMPLES] for x in data.validation.inputs]


def convert(options: ConvertOptions, hooks: Hooks = Hooks()) -> Converted:
    """Every stage up to the export, in memory: nothing is written."""
    clock = _Clock(hooks)
    if options.load.path is not None and is_graph_savedmodel(options.load.path):
        model, plan, context, loaded, report = convert_graph(options, clock)
        hooks.warning(LIMITS)
        return Converted(model, plan, context, loaded, report, read_files(options, context.data), options.speed_batch)
    precision = options.precision
    with clock.stage("load"):
        loaded = load_model(options.load)
        signature = signature_of(loaded.model)
        refuse_string_inputs(loaded.model, signature)
        tasks = tasks_of(loaded.model, signature)
        data = evaluation_data(loaded.model, signature, tasks, options.validate, options.seed)
        metrics, thresholds = judging(options, tasks, data)
    warning = warning_for(precision) if options.speed else None
    if warning:
        log.warning(warning)
        hooks.warning(warning)
    context = Context(loaded.model, loaded.framework, signature, tasks, metrics, data, precision, loaded.saved_loss)
    framework = loaded.framework
    smoke = [x[:2] for x in data.validation.inputs]
    finetune_options = options.finetune.resolved(has_train=data.train is not None)

    slow: list = []  # the slow-kernel guard's finding, after the first rewrite

    def convert_with(rewrite_options: RewriteOptions):
        """rewrite -> finetune -> validate, once per set of layers kept float32."""
        with clock.stage("rewrite"):
            rewritten = rewrite(loaded.model, framework, rewrite_options, proof_rows(data))
        if not slow:  # before any minutes go into a broken kernel
            with clock.stage("kernel check"):
                rows = list(data.validation.inputs)
                slow.append(guard(precision.name, loaded.model, rewritten.model, signature, rows, hooks.may_restart))
        tuning = None
        if finetune_options.steps:
            with clock.stage("finetune"):
                tuning = finetune(context, rewritten.model, finetune_options, options.seed, hooks.finetune_step)
        with clock.stage("validate"):
            validation = validate(context, rewritten.model)
        return rewritten, tuning, validation

    auto, rewrite_options = AutoKeep(options.auto_keep.mode), options.rewrite
    with framework.preserved_global_policy(), loaded.deserialization():
        if auto.mode != "off":
            with clock.stage("lint"):
                found, rewrite_options = keep_by_lint(context, rewrite_options)
            auto = dataclasses.replace(auto, lint=found)
        rewritten, tuning, validation = convert_with(rewrite_options)
        if auto.mode == "search" and not passes(validation.as_dict(), thresholds):
            with clock.stage("search"):
                searched, rewrite_options = keep_by_search(
                    context, rewritten, rewrite_options, thresholds, options.auto_keep, smoke, validation.as_dict()
                )
            auto = dataclasses.replace(auto, search=searched)
            if searched.validation is not None:
                rewritten, tuning, validation = convert_with(rewrite_options)
        model, padding = rewritten.model, None
        if options.pad.multiple:
            with clock.stage("pad"):
                rows = [x[: options.pad.proof_samples] for x in data.validation.inputs]
                padding = pad(rewritten.model, framework, options.pad, rows, precision)
                model = padding.model
        speed = padded_cost = None
        if options.speed:
            with clock.stage("speed"):
                speed = measure_speed(
                    loaded.model, model, list(data.validation.inputs), signature=signature, batch=options.speed_batch
                )
                if model is not rewritten.model:  # padded: what its pad/slice ops cost here
                    padded_cost = padding_cost(
                        rewritten.model,
                        model,
                        list(data.validation.inputs),
                        signature=signature,
                        batch=options.speed_batch,
                    )
    report = Report(
        policy=precision.name,
        source=loaded.source(options.load.path),
        layers=rewritten.plan.as_dicts(),
        fidelity=rewritten.fidelity.as_dict() if rewritten.fidelity else None,
        validation=validation.as_dict(),
        thresholds=thresholds,
        finetune=tuning.as_dict() if tuning else None,
        padding=padding.report if padding else None,
        auto_keep=auto.as_dict(),
        speed=(
            {**speed.as_dict(), "warning": warning, "target_note": target_note(precision), "padding": padded_cost}
            if speed
            else None
        ),
        slow_kernel=slow[0] if slow else None,
        timings=clock.timings,
    )
    return Converted(model, rewritten.plan, context, loaded, report, read_files(options, data), options.speed_batch)


def save(converted: Converted, options: SaveOptions, hooks: Hooks = Hooks()) -> tuple[Report, Path]:
    """Write and re-check the artifacts; the output folder appears whole or not at all."""
    with claimed_output(options.out, list(converted.inputs), options.force) as out:
        return _write(converted, out, options, hooks), out


def _write(converted: Converted, out: Path, options: SaveOptions, hooks: Hooks) -> Report:
    # The net under the writers that name what they write: any other OS
    # error (the staging folder, the final rename) is about the output too.
    if isinstance(converted.model, FrozenGraph):
        needed = graph_bytes(converted.model, options.export.kinds)
    else:
        needed = estimated_bytes(converted.model, options.export.kinds, converted.context.framework)
    with writing(out, "the output folder", needed):
        return _write_staged(converted, out, options, hooks)


def _write_staged(converted: Converted, out: Path, options: SaveOptions, hooks: Hooks) -> Report:
    clock = _Clock(hooks, dict(converted.report.timings))
    context = converted.context
    with converted.loaded.deserialization(), staged_output(out) as staging, reported_at(staging, out):
        with clock.stage("export"):
            if isinstance(converted.model, FrozenGraph):
                artifacts = export_graph(converted.model, list(context.data.validation.inputs), staging, options.export)
            else:
                artifacts = export_all(
                    converted.model,
                    context.framework,
                    context.signature,
                    list(context.data.validation.inputs),
                    staging,
                    options.export,
                )
        speed = converted.report.speed
        if options.export.bench_onnx and (staging / "model.onnx").is_file() and context.framework is not None:
            batch = speed["batch"] if speed else converted.speed_batch
            with clock.stage("bench-onnx"):
                timing = measure_onnx_speed(
                    context.original,
                    staging / "model.onnx",
                    list(context.data.validation.inputs),
                    signature=context.signature,
                    batch=batch,
                    opset=options.export.opset,
                )
            rows = context.data.validation.rows
            measured = Speed.from_dict(speed) if speed else Speed(probe_hardware().device, batch, rows)
            speed = {**(speed or {}), **measured.with_path("onnx", timing).as_dict()}
        report = dataclasses.replace(
            converted.report, artifacts=[a.as_dict() for a in artifacts], timings=clock.timings, speed=speed
        )
        report.write(staging)
        for name, value in options.attachments:
            write_text(staging / name, json.dumps(json_safe(value), indent=2, allow_nan=False) + "\n", name)
    return report


def convert_and_save(options: ConvertOptions, save_options: SaveOptions, hooks: Hooks = Hooks()) -> tuple[Report, Path]:
    """The command line's job: claim the output folder before any work, then convert and write.

    A folder that cannot be written, or that another run holds, fails here,
    before minutes of loading and fine-tuning.
    """
    with claimed_output(save_options.out, list(read_files(options)), save_options.force) as out:
        return _write(convert(options, hooks), out, save_options, hooks), out
