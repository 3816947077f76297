"""The Python API: convert, inspect and check, for notebooks, scripts and batch workers.

The command line is a thin layer over these functions: both build their
options with `conversion_options` and run `pipeline`'s stages, so the same
inputs give the same report. Nothing here imports TensorFlow at import
time; the stages do, when they run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from inspect import Parameter, Signature
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpconvert.commands.replay import ReplayInputs, replay_inputs
from mpconvert.options.convert import CONVERSION_KEYWORDS, ConvertOptions
from mpconvert.options.export import EXPORT_KEYWORDS, ExportOptions, SaveOptions
from mpconvert.options.finetune import FinetuneOptions
from mpconvert.options.gate import GATE_KEYWORDS, GateOptions
from mpconvert.options.keywords import Keyword, build, refuse_unknown
from mpconvert.options.load import LoadOptions
from mpconvert.options.pad import PadOptions
from mpconvert.options.rewrite import AutoKeepOptions, RewriteOptions
from mpconvert.options.signing import SIGNING_KEYWORDS, SigningOptions
from mpconvert.options.tracking import TRACKING_KEYWORDS, TrackingOptions
from mpconvert.options.validate import ValidateOptions
from mpconvert.options.verify import VERIFY_KEYWORDS, VerifyOptions
from mpconvert.system.errors import MpconvertError
from mpconvert.system.hooks import Hooks
from mpconvert.system.usercode import importing_from

if TYPE_CHECKING:
    from mpconvert.kinds.base import PaddingPlan
    from mpconvert.report.report import Report
    from mpconvert.report.sections import Source
    from mpconvert.report.verification import BatchVerification, VerifyReport


def _signature(keywords: Mapping[str, Keyword], *leading: Parameter) -> Signature:
    """What help() and editors show for a function that takes a keyword table's keywords."""
    named = [Parameter(k, Parameter.KEYWORD_ONLY, default=spec.default) for k, spec in keywords.items()]
    return Signature([*leading, *named])


def gate_options(**thresholds: Any) -> GateOptions:
    """Gate thresholds from keywords (max_drop, min_agreement, atol, rtol, baseline, max_regression, min_speedup)."""
    refuse_unknown(thresholds, GATE_KEYWORDS, "threshold")
    return build(GateOptions, thresholds, GATE_KEYWORDS)


def export_options(**keywords: Any) -> ExportOptions:
    """Export options from keywords (export, opset, bench_onnx)."""
    refuse_unknown(keywords, EXPORT_KEYWORDS, "export option")
    return build(ExportOptions, keywords, EXPORT_KEYWORDS)


def tracking_options(**keywords: Any) -> TrackingOptions:
    """MLflow tracking from keywords (mlflow, mlflow_experiment, register, mlflow_optional); off without mlflow."""
    refuse_unknown(keywords, TRACKING_KEYWORDS, "tracking option")
    return build(TrackingOptions, keywords, TRACKING_KEYWORDS)


def signing_options(**keywords: Any) -> SigningOptions:
    """Signing from keywords (sign_key: an elliptic-curve private key's PEM file); unsigned without it."""
    refuse_unknown(keywords, SIGNING_KEYWORDS, "signing option")
    return build(SigningOptions, keywords, SIGNING_KEYWORDS)


def conversion_options(model: Any, policy: str, **keywords: Any) -> ConvertOptions:
    """The one options object of a conversion, from the keywords the CLI, the manifest and `convert` share.

    The keywords are options.CONVERSION_KEYWORDS (docs/options.md lists
    them); any other is refused with the nearest valid name.
    """
    refuse_unknown(keywords, CONVERSION_KEYWORDS, "conversion option")

    def part(owner: type, **fixed: Any) -> Any:
        return build(owner, keywords, CONVERSION_KEYWORDS, **fixed)

    return part(
        ConvertOptions,
        load=part(LoadOptions, source=model),
        rewrite=part(RewriteOptions, policy=policy),
        validate=part(ValidateOptions),
        finetune=part(FinetuneOptions),
        pad=part(PadOptions),
        gate=part(GateOptions),
        auto_keep=part(AutoKeepOptions),
    )


_POSITIONAL = Parameter.POSITIONAL_OR_KEYWORD
# What help() and editors show: the keyword tables, not **keywords.
setattr(  # noqa: B010
    conversion_options,
    "__signature__",
    _signature(CONVERSION_KEYWORDS, Parameter("model", _POSITIONAL), Parameter("policy", _POSITIONAL)),
)
setattr(gate_options, "__signature__", _signature(GATE_KEYWORDS))  # noqa: B010
setattr(export_options, "__signature__", _signature(EXPORT_KEYWORDS))  # noqa: B010
setattr(tracking_options, "__signature__", _signature(TRACKING_KEYWORDS))  # noqa: B010
setattr(signing_options, "__signature__", _signature(SIGNING_KEYWORDS))  # noqa: B010


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
    def result(self) -> Report:
        """The report, typed (artifacts appear once saved): what the gate judged, and every section."""
        return self._report

    @property
    def report(self) -> dict:
        """The report, as report.json holds it (artifacts appear once saved); `result` is the typed one."""
        return self._report.to_json()

    @property
    def passed(self) -> bool:
        return self._report.passed

    @property
    def exit_code(self) -> int:
        return self._report.exit_code

    @property
    def layers(self) -> tuple:
        """Per-layer decisions: name, class_name, policy, why a layer stayed float32, and the sublayers inside
        a layer (`inside` names it)."""
        return self._converted.plan.rows

    def save(
        self,
        out: str | Path,
        *,
        force: bool = False,
        on_stage: Callable[[str], None] | None = None,
        **keywords: Any,
    ) -> dict:
        """Write and re-check the artifacts into `out` (staged: whole or nothing); returns the final report.

        `keywords` are the export keywords (export, opset, bench_onnx; see
        options.EXPORT_KEYWORDS): export=("savedmodel",) writes only the
        SavedModel; bench_onnx also times the ONNX file against a float32
        export (one more export); and the tracking keywords:
        mlflow="http://HOST:5000" (or True for MLFLOW_TRACKING_URI) records
        the written folder as an MLflow run, register="NAME" also registers
        the SavedModel when the gate passed, mlflow_experiment,
        mlflow_optional; and sign_key="key.pem" signs the finished folder
        (model.sig; an encrypted key's password from
        MPCONVERT_SIGN_KEY_PASSWORD).
        """
        from mpconvert.pipeline import save

        saving = {**TRACKING_KEYWORDS, **SIGNING_KEYWORDS}
        export = {k: v for k, v in keywords.items() if k not in saving}
        tracking = tracking_options(**{k: v for k, v in keywords.items() if k in TRACKING_KEYWORDS})
        signing = signing_options(**{k: v for k, v in keywords.items() if k in SIGNING_KEYWORDS})
        # A URL stays a string: object storage.
        options = SaveOptions(out, export_options(**export), force, tracking=tracking, signing=signing)
        self._report, _ = save(self._converted, options, _hooks(on_stage, None))
        return self.report

    def __repr__(self) -> str:
        verdict = "passed" if self.passed else "failed"
        return f"<Conversion {self._report.source.name!r} -> {self._report.policy}: {verdict}>"


def _hooks(on_stage, on_finetune_step):
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
    from mpconvert.pipeline import convert as run

    tracking = [name for name in keywords if name in TRACKING_KEYWORDS or name in SIGNING_KEYWORDS]
    if tracking:  # a run records (a signature covers) a written output folder, and convert() writes none
        raise MpconvertError(
            f"{tracking[0]} is a keyword of Conversion.save, not of convert: it is about the written output",
            hint=f"conversion = mpconvert.convert(model, policy, ...); conversion.save(out, {tracking[0]}=...)",
        )
    options = conversion_options(model, policy, **keywords)
    return Conversion(run(options, _hooks(on_stage, on_finetune_step)))


@dataclass(frozen=True)
class Inspection:
    """What a conversion would do, per layer: policies and padding, nothing converted."""

    described: Source  # the model: path, name, parameters, format, loader, inputs, outputs
    policy: str
    layers: tuple  # LayerDecision per layer, the lint's keeps included
    padding: PaddingPlan | None  # None with pad_multiple=0
    lint: Any = None  # a lint.Lint: findings with their numbers (None with auto_keep="off")

    @property
    def source(self) -> dict:
        """The model as the report's JSON form describes it (what callers of earlier versions read)."""
        return self.described.to_json()


def inspect(model: Any, policy: str = "mixed_float16", **keywords: Any) -> Inspection:
    """The per-layer plan a conversion with these keywords would follow, nothing converted.

    Keywords are `conversion_options`'; the ones the plan uses are
    keep_float32, pad_multiple, max_pad_overhead, data and auto_keep (the
    numeric lint; "off" skips it), and the loading ones.
    """
    from mpconvert.pipeline import inspect as plan

    options = conversion_options(model, policy, **keywords)
    found = plan(options)
    return Inspection(found.source.describe(options.load.path), policy, found.plan.rows, found.padding, found.lint)


def check(report: dict | str | Path, **thresholds: Any) -> dict:
    """Re-apply the gate to a report (a dict, a report.json, or its folder); never imports TensorFlow.

    Thresholds not given (max_drop, min_agreement, atol, rtol, baseline,
    max_regression) keep the values stored in the report. Returns the
    re-judged report: its "passed" and "gate" are the new verdict.
    """
    from mpconvert.report.read import read_report

    stored = report if isinstance(report, dict) else read_report(Path(report))
    return recheck(stored, gate_options(**thresholds)).to_json()


def recheck(stored: dict, options: GateOptions) -> Report:
    """A stored report (report.json's content) judged again with `options` over its own thresholds."""
    from mpconvert.report.read import load_baseline
    from mpconvert.report.report import Report

    # Judged on its raw figures: a derived one it stores that they contradict fails the gate.
    report = Report.read_back(stored)
    baseline = load_baseline(options.baseline, report.measured) if options.baseline else None
    return dataclasses.replace(report, thresholds=report.thresholds.overridden(options, baseline))


@dataclass(frozen=True)
class Replay:
    """A conversion run again from what its report recorded, and what differs from the report."""

    replayed: Path  # the report.json replayed
    out: Path | str  # the new output folder, or its URL
    report: dict  # the new report, as report.json holds it
    compared: tuple  # comparison.Difference for every compared field
    exit_code: int  # the new run's, as the main command's
    result: Report | None = None  # the new report, typed

    @property
    def differences(self) -> tuple:
        return tuple(d for d in self.compared if not d.same)


def replay_options(inputs: ReplayInputs) -> tuple[ConvertOptions, ExportOptions]:
    """The conversion and export options of a report's checked inputs (replay_inputs.replay_inputs)."""
    keywords = dict(inputs.keywords)
    model, policy = keywords.pop("model"), keywords.pop("policy")
    export = {k: keywords.pop(k) for k in list(keywords) if k in EXPORT_KEYWORDS}
    return conversion_options(model, policy, **keywords), export_options(**export)


def replay(
    report: str | Path,
    out: str | Path | None = None,
    *,
    force: bool = False,
    on_stage: Callable[[str], None] | None = None,
    command: tuple[str, ...] | None = None,
    may_restart: bool = False,
) -> Replay:
    """Convert again from what `report` (a report.json or its folder) recorded, into `out`, and compare.

    Every file is read by the absolute path the report recorded, after
    checking its sha256 (the model, the data file, a baseline report, the
    modules --import named), and the user's modules are found from the
    folder the recorded run started in: the same conversion from any
    folder, or MpconvertError naming the file that differs. `out` defaults to the report's folder
    name plus `_replay`, beside it; an existing non-empty folder needs
    `force`. `command` is recorded as the replay's command line (the CLI
    passes its own). `may_restart`: the command line may re-run itself with
    oneDNN's rewrites off where the slow-kernel guard finds a broken kernel,
    as the conversion it replays did (a Python process cannot).
    """
    from mpconvert.pipeline import convert_and_save
    from mpconvert.report.diff import compared
    from mpconvert.report.read import read_report

    path = Path(report)
    path = path / "report.json" if path.is_dir() else path
    stored = read_report(path)
    inputs = replay_inputs(stored, path)
    options, export = replay_options(inputs)
    folder = path.absolute().parent
    target = out if out is not None else folder.parent / f"{folder.name}_replay"
    save = SaveOptions(target, export, force, command=command)
    hooks = dataclasses.replace(_hooks(on_stage, None), may_restart=may_restart)
    with importing_from(inputs.folder):  # the user's modules, as the recorded run found them
        new, written = convert_and_save(options, save, hooks)
    again = new.to_json()
    return Replay(path, written, again, compared(stored, again), new.exit_code, new)


def sign(folder: str | Path, *, sign_key: str | Path, force: bool = False) -> list[Path]:
    """Sign a folder converted before (or a batch root and its model folders), as `mpconvert sign` does.

    Every file its report recorded a sha256 for is checked first: a changed
    one refuses the folder (MpconvertError). A folder already signed needs
    `force`. Returns the folders signed. An encrypted key's password comes
    from MPCONVERT_SIGN_KEY_PASSWORD, never from an argument.
    """
    from mpconvert.commands.sign import sign_output
    from mpconvert.commands.signature import load_signer

    signer = load_signer(signing_options(sign_key=sign_key))
    assert signer is not None
    return [signed.folder for signed in sign_output(folder, signer, force=force)]


def verify_options(**keywords: Any) -> VerifyOptions:
    """Verify options from keywords (provider, fallback, speed_batch, artifacts, public_key, require_signature)."""
    refuse_unknown(keywords, VERIFY_KEYWORDS, "verify option")
    return build(VerifyOptions, keywords, VERIFY_KEYWORDS)


def verified(folder: str | Path, *, write: bool = True, **keywords: Any) -> VerifyReport | BatchVerification:
    """`verify`, typed: the folder's (or the batch root's) verification, whose `to_json()` is verify.json."""
    from mpconvert.commands.verify import verify_path

    return verify_path(folder, verify_options(**keywords), write=write)


def verify(folder: str | Path, *, write: bool = True, **keywords: Any) -> dict:
    """Check an output folder (or a batch root) on this machine, as `mpconvert verify` does; verify.json's content.

    Every artifact's sha256 against report.json, each SavedModel and ONNX
    file run on the golden rows (parity with the converted model, drift
    from float32), timed at a serving batch, its memory measured, and the
    library versions that differ from the conversion's. `write` puts
    verify.json beside report.json. Its "exit_code" is the command's: 0
    passed, 3 a check failed. Keywords: provider ("auto", "cpu", "cuda",
    "tensorrt"), fallback, speed_batch, artifacts, public_key (check the
    folder's signature with it first: a missing, broken or other key's one
    fails) and require_signature.
    """
    return verified(folder, write=write, **keywords).to_json()
