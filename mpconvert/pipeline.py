"""The one place where the stage order lives, for every kind of model.

In memory (`convert`):

    load (+ kernel probe beside it) -> lint -> rewrite (+ float32 fidelity proof) -> kernel check -> finetune -> validate
         -> search (when the gate would fail; then rewrite -> finetune -> validate again)
         -> pad (+ equivalence proof) -> speed -> golden rows (the float32 original's last run)

then into a staged output folder (`save`; `convert_and_save`, which owns the conversion, first lets go of
the float32 original unless --bench-onnx exports it, so that the artifacts re-load into its memory):

    export (+ every artifact re-loaded and re-run) -> bench-onnx -> report -> sign -> rename into place
         (or upload) -> mlflow (with --mlflow: the folder as one run; its tracking server is checked before any work)

The signature (with --sign-key; its key is loaded and checked before any
work) covers every file of the folder, so it is the last thing written
before the folder appears: nothing can change after it, and an upload
carries it with the bytes it signs.

Each stage is a method of the loaded model's kind (kinds/: a Keras model,
a plain SavedModel's frozen graph) or a function with explicit inputs that
returns a result object; this module only wires them together and times
them. A stage not every kind can do (`kinds.Capability`) is asked of the
kind first (`finetuner()`, `padder()`, ...): where it answers `Unavailable`,
the stage is skipped and the report's `skipped` says which and why. The
CLI, the Python API and batch workers all run these functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from mpconvert.commands.replay import provenance, read_files
from mpconvert.commands.signature import Signer, load_signer, sign_folder
from mpconvert.data.context import Context
from mpconvert.data.rows import EvalData, evaluation_data
from mpconvert.export.formats import FORMATS, export_all
from mpconvert.export.tracking import SKIPPED_STAGE, Tracker
from mpconvert.export.tracking import start as start_tracking
from mpconvert.kinds import Capability, ModelKind, PaddingPlan, Plan, Unavailable, available, open_model
from mpconvert.numerics.search import Goal, passes
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.options.convert import ConvertOptions
from mpconvert.options.export import ExportOptions, SaveOptions
from mpconvert.options.keywords import keywords_of
from mpconvert.options.rewrite import AutoKeepMode, RewriteOptions
from mpconvert.options.validate import PARITY_SAMPLES, Metric
from mpconvert.render.html import REPORT_HTML, write_report_page
from mpconvert.report.golden import GOLDEN_NAME, GOLDEN_ROWS, GoldenRows, write_golden
from mpconvert.report.measure import judge, judging
from mpconvert.report.report import REPORT_NAME, Report, json_safe
from mpconvert.report.sections import (
    Artifact,
    AutoKeep,
    Golden,
    Lint,
    Skipped,
    SpeedNotes,
    SpeedReport,
    Timings,
)
from mpconvert.report.sections.provenance import recorded_options
from mpconvert.speed import (
    SPEED_BATCH,
    PathSpeed,
    Speed,
    kernel_probe,
    measure_artifact_speed,
    measure_onnx_speed,
    measure_speed,
    padding_cost,
    probe_hardware,
    target_note,
    warning_for,
)
from mpconvert.speed.slow_kernel import early, guard, kernel_probe_wanted
from mpconvert.system import interrupts
from mpconvert.system.errors import MpconvertError
from mpconvert.system.hooks import NO_HOOKS, Hooks
from mpconvert.system.objectstore import staged_upload
from mpconvert.system.outdir import claimed_output, staged_output
from mpconvert.system.urls import is_url, without_credentials
from mpconvert.system.writing import reported_at, write_text, writing

log = logging.getLogger("mpconvert")
M = TypeVar("M")  # the model type of the kind at hand

__all__ = ["Converted", "Hooks", "Inspected", "convert", "convert_and_save", "inspect", "save"]


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

    model: Any  # the kind's model: padded when the padding proof passed, else the rewritten model
    plan: Plan
    source: ModelKind[Any, Any]  # the loaded float32 model and its kind
    context: Context
    report: Report
    inputs: tuple[Path, ...]  # files the run read, which no output may overwrite
    golden: GoldenRows  # golden.npz's rows, run on the float32 original while it is loaded
    speed_batch: int = SPEED_BATCH  # the serving batch the speed stage (and --bench-onnx) time at


def proof_rows(data: EvalData) -> list[np.ndarray]:
    """The validation rows the rebuild and padding proofs run on."""
    return [x[:PARITY_SAMPLES] for x in data.validation.inputs]


def skipped_stages(source: ModelKind[Any, Any], options: ConvertOptions, data: EvalData) -> tuple[Skipped, ...]:
    """The stages these options would run that the model's kind cannot do, and why.

    A fine-tune asked for in so many steps is refused instead: the user
    asked for it by name.
    """
    steps = options.finetune.resolved(has_train=data.train is not None).steps
    wanted = {
        Capability.FINETUNE: bool(steps),
        Capability.PAD: bool(options.pad.multiple),
        Capability.ACTIVATION_MEMORY: options.speed,
    }
    lacking = source.lacking()
    return tuple(Skipped(str(c), lacking[c]) for c, on in wanted.items() if on and c in lacking)


def _refuse_unable(source: ModelKind[Any, Any], options: ConvertOptions) -> None:
    finetuner = source.finetuner()
    if options.finetune.steps and isinstance(finetuner, Unavailable):
        raise MpconvertError(
            f"{options.load.path}: {finetuner.reason}",
            hint="pass --finetune-steps 0 (the default when the data has no training split)",
        )


@dataclass(frozen=True)
class Inspected:
    """What `inspect` found: the loaded model, the per-unit plan, the padding plan and the lint."""

    source: ModelKind[Any, Any]
    plan: Plan
    padding: PaddingPlan | None
    lint: Lint | None = None  # the numeric lint's findings (None with --auto-keep off)


def inspect(options: ConvertOptions) -> Inspected:
    """The per-unit policy, lint and padding plans, without converting or writing anything.

    The lint runs the float32 model on the data (else generated inputs), as a
    conversion does, and its keeps are in the plan. Padding is planned on the
    rewritten model, as the conversion does: a softmax split off an output
    layer changes what can be padded.
    """
    source = open_model(options.load)
    inspector = source.inspector()
    if isinstance(inspector, Unavailable):
        raise MpconvertError(
            f"{options.load.path} {inspector.reason}",
            hint="convert it with the main command, or re-save the model from the code that built it with "
            "model.save('model.keras')",
        )
    rewrite_options, found = options.rewrite, None
    with source.scope():
        data = evaluation_data(source.original, source.signature, source.tasks, options.validate, options.seed)
        if options.auto_keep.mode is not AutoKeepMode.OFF:
            metrics = (Metric.ACCURACY,) * len(source.tasks)
            context = Context(source.signature, source.tasks, metrics, data, options.precision)
            found, rewrite_options = source.lint(context, rewrite_options)
        padder = available(source.padder()) if options.pad.multiple else None
        if padder is None:
            return Inspected(source, inspector.plan(rewrite_options), None, found)
        rewritten = source.rewrite(rewrite_options, proof_rows(data))
        padding = padder.plan(rewritten.model, options.pad)
    return Inspected(source, rewritten.plan, padding, found)


def convert(options: ConvertOptions, hooks: Hooks = NO_HOOKS) -> Converted:
    """Every stage up to the export, in memory: nothing is written."""
    clock = _Clock(hooks)
    precision = options.precision
    # The kernel probe runs in a child process beside the load (cached per machine: usually no child at all).
    pending = kernel_probe.start((precision.name,)) if kernel_probe_wanted(precision.name) else None
    with clock.stage("load"):
        try:
            source = open_model(options.load)
        except BaseException:
            if pending:
                pending.stop()
            raise
        _refuse_unable(source, options)
        data = evaluation_data(source.original, source.signature, source.tasks, options.validate, options.seed)
        metrics, thresholds = judging(options, source.tasks, data)
        record = provenance(options, data)
    if source.limits:
        hooks.warning(source.limits)
    warning = warning_for(precision) if options.speed else None
    if warning:
        log.warning(warning)
        hooks.warning(warning)
    context = Context(source.signature, source.tasks, metrics, data, precision)
    inputs = list(data.validation.inputs)
    finetune_options = options.finetune.resolved(has_train=data.train is not None)
    finetuner = available(source.finetuner()) if finetune_options.steps else None
    reference: list[np.ndarray] = []  # the float32 model's validation outputs, run once
    slow: list = []  # the slow-kernel guard's finding, after the first rewrite
    if pending:
        with clock.stage("kernel probe"):  # before a second goes into a broken kernel on this model
            found_early = early(precision.name, pending.result().get(precision.name), hooks.may_restart)
        if found_early:
            slow.append(found_early)

    def convert_with(rewrite_options: RewriteOptions):
        """rewrite -> finetune -> validate, once per set of units kept float32."""
        with clock.stage("rewrite"):
            candidate = source.rewrite(rewrite_options, proof_rows(data))
        if not slow:  # before any minutes go into a broken kernel
            with clock.stage("kernel check"):
                original, converted = source.runner(source.original), source.runner(candidate.model)
                slow.append(guard(precision.name, original, converted, inputs, options.speed_batch, hooks.may_restart))
        tuning = None
        if finetuner is not None:
            with clock.stage("finetune"):
                tuning = finetuner.finetune(
                    context, candidate.model, finetune_options, options.seed, hooks.finetune_step
                )
        with clock.stage("validate"):
            if not reference:
                reference.extend(source.runner(source.original).run(inputs).outputs)
            validation = judge(context, reference, source.runner(candidate.model).run(inputs).outputs)
        return candidate, tuning, validation

    auto, rewrite_options = AutoKeep(options.auto_keep.mode, note=source.limits), options.rewrite
    with source.scope():
        if auto.mode is not AutoKeepMode.OFF:
            with clock.stage("lint"):
                found, rewrite_options = source.lint(context, rewrite_options)
            auto = dataclasses.replace(auto, lint=found)
        candidate, tuning, validation = convert_with(rewrite_options)
        if auto.mode is AutoKeepMode.SEARCH and not passes(validation, thresholds):
            with clock.stage("search"):
                goal = Goal(lambda v: passes(v, thresholds), options.auto_keep.search_budget, reference, validation)
                searched, rewrite_options = source.search(context, candidate, rewrite_options, goal)
            auto = dataclasses.replace(auto, search=searched.section())
            if searched.validation is not None:
                candidate, tuning, validation = convert_with(rewrite_options)
        model, padding = candidate.model, None
        padder = available(source.padder()) if options.pad.multiple else None
        if padder is not None:
            with clock.stage("pad"):
                rows = [x[: options.pad.proof_samples] for x in inputs]
                padding = padder.pad(candidate.model, options.pad, rows, precision)
                model = padding.model
        speed = padded_cost = None
        if options.speed:
            meter = available(source.activation_memory_meter())
            with clock.stage("speed"):
                speed = measure_speed(
                    {path: (source.runner(source.original, path), source.runner(model, path)) for path in source.paths},
                    inputs,
                    batch=options.speed_batch,
                    memory=(lambda rows: meter.measure(model, options.speed_batch, rows)) if meter else None,
                )
                if model is not candidate.model:  # padded: what its pad/slice ops cost here
                    serving = source.paths[-1]
                    padded_cost = padding_cost(
                        source.runner(candidate.model, serving),
                        source.runner(model, serving),
                        inputs,
                        batch=options.speed_batch,
                    )
        golden = golden_rows(source, model, inputs)
    report = Report(
        policy=precision.name,
        source=source.describe(options.load.path),
        layers=candidate.plan.as_layers(),
        fidelity=candidate.fidelity,
        validation=validation,
        thresholds=thresholds,
        finetune=tuning,
        padding=padding.report if padding else None,
        auto_keep=auto,
        speed=SpeedReport(speed, SpeedNotes(warning, target_note(precision), padded_cost)) if speed else None,
        slow_kernel=slow[0] if slow else None,
        skipped=skipped_stages(source, options, data),
        timings=Timings.of(clock.timings),
        provenance=record,
    )
    return Converted(
        model, candidate.plan, source, context, report, read_files(options, data), golden, options.speed_batch
    )


def export(
    source: ModelKind[M, Any], model: M, inputs: list[np.ndarray], out: Path, options: ExportOptions
) -> list[Artifact]:
    """Every requested artifact of `model` under `out`, each re-run on the first validation rows."""
    rows = [x[: options.parity_samples] for x in inputs]
    expected = source.runner(model).run(rows).outputs
    return export_all(
        source.writes(model, rows), rows, expected, out, options, source.output_bytes(model, options.kinds)
    )


def golden_rows(source: ModelKind[M, Any], model: M, inputs: list[np.ndarray]) -> GoldenRows:
    """The first validation rows with the float32 and the converted model's outputs (golden.npz's content)."""
    rows = [x[:GOLDEN_ROWS] for x in inputs]
    return GoldenRows(rows, source.runner(source.original).run(rows).outputs, source.runner(model).run(rows).outputs)


def save_golden(source: ModelKind, found: GoldenRows, out: Path) -> Golden:
    """golden.npz under `out`, and the report's record of it."""
    write_golden(out / GOLDEN_NAME, source.signature, found)
    return Golden.of(out, GOLDEN_NAME, found.rows)


def bench_onnx(
    source: ModelKind[Any, Any], converted: Path, inputs: list[np.ndarray], batch: int, opset: int
) -> PathSpeed:
    """The written ONNX file against a float32 ONNX export of the original (one more export, removed after).

    Both are opened as the float32 export records them: the two files of one signature take the same names.
    """
    onnx = FORMATS[ArtifactKind.ONNX]
    with tempfile.TemporaryDirectory(prefix="mpconvert-bench-onnx-") as tmp:
        baseline = source.onnx(source.original, Path(tmp) / "float32.onnx", opset)
        recorded = onnx.recorded(baseline)
        return measure_onnx_speed(
            onnx.open(baseline.export.path, recorded, source.signature),
            onnx.open(converted, recorded, source.signature),
            converted.name,
            inputs,
            batch=batch,
        )


def speed_openvino(
    source: ModelKind[Any, Any], folder: Path, artifact: Artifact, inputs: list[np.ndarray], batch: int
) -> PathSpeed:
    """The written OpenVINO IR, compiled as its check was, against the float32 original's serving path here."""
    openvino = FORMATS[ArtifactKind.OPENVINO]
    assert artifact.path is not None
    runner = openvino.open(folder / artifact.path, artifact.details, source.signature)
    float32 = source.runner(source.original, source.paths[-1])
    return measure_artifact_speed(float32, runner, artifact.path, inputs, batch=batch)


def keeps_original(options: ConvertOptions, save_options: SaveOptions) -> bool:
    """Whether the float32 original runs after the conversion: --bench-onnx exports it, and the speed stage
    times the OpenVINO IR against it."""
    kinds = save_options.export.kinds
    return save_options.export.bench_onnx or (options.speed and ArtifactKind.OPENVINO in kinds)


@contextlib.contextmanager
def _claimed(options: SaveOptions, inputs: list[Path]) -> Iterator[Path]:
    """The local folder to write into: `--out` itself, or for object storage a staging folder uploaded at the end.

    A prefix in object storage is checked (and a non-empty one refused without
    --force) before any work, as a local folder is; the upload puts
    report.json last, so a reader never takes a partial upload for a result.
    """
    if is_url(options.out):
        with staged_upload(str(options.out), options.force, REPORT_NAME) as local:
            with claimed_output(local, inputs, force=False) as out:
                yield out
    else:
        with claimed_output(Path(options.out), inputs, options.force) as out:
            yield out


def written_at(options: SaveOptions, out: Path) -> Path | str:
    """Where the output ended up: the folder, or the object-storage prefix it was uploaded to."""
    return without_credentials(str(options.out)) if is_url(options.out) else out


def _signer(options: SaveOptions, hooks: Hooks) -> Signer | None:
    """--sign-key's key, loaded and checked (readable, decrypted, a curve model signing takes) before any work."""
    signer = load_signer(options.signing)
    for warning in signer.warnings if signer else ():
        log.warning(warning)
        hooks.warning(warning)
    return signer


def save(converted: Converted, options: SaveOptions, hooks: Hooks = NO_HOOKS) -> tuple[Report, Path | str]:
    """Write and re-check the artifacts; the output folder (or prefix) appears whole or not at all."""
    signer = _signer(options, hooks)
    tracker = start_tracking(options.tracking, options.export.kinds, hooks)
    with _claimed(options, list(converted.inputs)) as out:
        report = _write_tracked(converted, out, options, hooks, tracker, signer)
    return report, written_at(options, out)


def _write_tracked(
    converted: Converted, out: Path, options: SaveOptions, hooks: Hooks, tracker: Tracker, signer: Signer | None
) -> Report:
    """Write the output, then record it as an MLflow run when asked.

    Logged from `out` while the claim still holds it: for a local output the
    final folder, for object storage the complete local copy, before the
    upload (which then carries the same files).
    """
    if tracker.skipped is not None:  # --mlflow-optional and a server that failed its check: the report says so
        skipped = (*converted.report.skipped, Skipped(SKIPPED_STAGE, tracker.skipped))
        converted = dataclasses.replace(converted, report=dataclasses.replace(converted.report, skipped=skipped))
    report = _write(converted, out, options, hooks, signer)
    if tracker.active:
        hooks.stage("mlflow")
        tracker.log(report, out)
    return report


def _write(converted: Converted, out: Path, options: SaveOptions, hooks: Hooks, signer: Signer | None) -> Report:
    # The net under the writers that name what they write: any other OS
    # error (the staging folder, the final rename) is about the output too.
    needed = converted.source.output_bytes(converted.model, options.export.kinds)
    with writing(out, "the output folder", needed):
        return _write_staged(converted, out, options, hooks, signer)


def _write_staged(converted: Converted, out: Path, options: SaveOptions, hooks: Hooks, signer: Signer | None) -> Report:
    clock = _Clock(hooks, converted.report.timings.seconds())
    source, context = converted.source, converted.context
    inputs = list(context.data.validation.inputs)
    with source.scope(), staged_output(out) as staging, reported_at(staging, out):
        with clock.stage("export"):
            artifacts = export(source, converted.model, inputs, staging, options.export)
            golden = save_golden(source, converted.golden, staging)
        speed = converted.report.speed
        onnx_file = staging / FORMATS[ArtifactKind.ONNX].filename
        if options.export.bench_onnx and onnx_file.is_file():
            batch = speed.measured.batch if speed else converted.speed_batch
            with clock.stage("bench-onnx"):
                timing = bench_onnx(source, onnx_file, inputs, batch, options.export.opset)
            # Without the speed stage, the ONNX file's timing is the section's only path (and it has no notes).
            speed = speed or SpeedReport(Speed(probe_hardware().device, batch, context.data.validation.rows))
            speed = speed.with_path("onnx", timing)
        written = next((a for a in artifacts if a.kind == ArtifactKind.OPENVINO and not a.failed), None)
        if speed is not None and written is not None and source.original is not None:
            with clock.stage("speed openvino"):
                speed = speed.with_path(
                    "openvino", speed_openvino(source, staging, written, inputs, speed.measured.batch)
                )
        record = converted.report.provenance
        if record is not None:  # the export's options and the command were chosen for the save
            options_then = {**record.options, **recorded_options(keywords_of(options.export))}
            record = dataclasses.replace(record, options=options_then, command=options.command)
        report = dataclasses.replace(
            converted.report,
            artifacts=tuple(artifacts),
            timings=Timings.of(clock.timings),
            speed=speed,
            provenance=record,
            golden=golden,
        )
        write_report(report, staging)
        for name, value in options.attachments:
            write_text(staging / name, json.dumps(json_safe(value), indent=2, allow_nan=False) + "\n", name)
        if signer is not None:  # last: it covers every file above
            with clock.stage("sign"):
                sign_folder(staging, signer)
    return report


def write_report(report: Report, folder: Path) -> Path:
    """report.json and, beside it, report.html (the same report, rendered)."""
    path = report.write_json(folder / REPORT_NAME)
    write_report_page(report, folder / REPORT_HTML)
    return path


def convert_and_save(
    options: ConvertOptions, save_options: SaveOptions, hooks: Hooks = NO_HOOKS
) -> tuple[Report, Path | str]:
    """The command line's job: claim the output folder before any work, then convert and write.

    A folder that cannot be written, or that another run holds, fails here,
    before minutes of loading and fine-tuning, and so does an MLflow
    tracking server that cannot be reached or refuses access.
    """
    signer = _signer(save_options, hooks)  # a key that cannot sign, too
    tracker = start_tracking(save_options.tracking, save_options.export.kinds, hooks)  # a server that is down, too
    with _claimed(save_options, list(read_files(options))) as out:
        converted = convert(options, hooks)
        if not keeps_original(options, save_options):
            converted.source.release()
        report = _write_tracked(converted, out, save_options, hooks, tracker, signer)
    return report, written_at(save_options, out)
