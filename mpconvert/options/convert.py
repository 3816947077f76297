"""Frozen options for every stage, built once at the CLI edge.

Nothing below the CLI sees click: each stage takes the one options object it
needs. Validation of values that click cannot express (regexes, paths that
must not overlap) happens here, once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from mpconvert.options.artifact_kinds import DEFAULT_EXPORT, EXPORT_KINDS
from mpconvert.options.gate import GateOptions
from mpconvert.options.keywords import Keyword, check_ranges, keyword, table
from mpconvert.options.precision import Precision
from mpconvert.options.tracking import TrackingOptions
from mpconvert.system.errors import MpconvertError
from mpconvert.system.urls import is_url, local_path, output_url


class Metric(StrEnum):
    """What the gate scores an output by; a drop is always how much worse (worse_by)."""

    ACCURACY = "accuracy"
    MSE = "mse"
    # A sequence output's (see tasks.Task.tokens): per token, padding left out.
    TOKEN_ACCURACY = "token_accuracy"
    CROSS_ENTROPY = "cross_entropy"  # mean negative log-likelihood of the label token, in nats

    @property
    def higher_is_better(self) -> bool:
        return self in (Metric.ACCURACY, Metric.TOKEN_ACCURACY)


class AutoKeepMode(StrEnum):
    """How much of automatic float32 runs (numerics/autokeep.py)."""

    OFF = "off"  # the gate fails and says so
    LINT = "lint"  # keep what the numeric lint flags
    SEARCH = "search"  # and search for what fixes a failing accuracy or agreement check


METRICS = tuple(metric.value for metric in Metric)


@dataclass(frozen=True)
class LoadOptions:
    # A model file or folder, or a live keras / tf_keras model (Python API),
    # which is read but never modified.
    source: Any
    unsafe_deserialization: bool = keyword(
        False, kind="bool", help="Allow Lambda layers, whose code runs while loading. Only for files you trust."
    )
    # Imported before loading, so that their register_keras_serializable classes are found.
    imports: tuple[str, ...] = keyword(
        (),
        kind="strings",
        flag="--import",
        metavar="MODULE",
        help="Import MODULE before loading, so the custom layers it registers are found (repeatable). "
        "This runs that module's code.",
    )
    custom_objects: Any = keyword(
        None, kind="object", help="Python API only: {name: class} for custom layers, like Keras's own argument."
    )
    signature: str | None = keyword(
        None,
        metavar="NAME",
        default_text="serving_default",
        help="The serving signature of a SavedModel without Keras metadata (converted as a graph).",
    )

    def __post_init__(self) -> None:
        if isinstance(self.source, (str, Path)):
            local_path(self.source, "the model")  # pathlib would read s3://b/m.keras as a local "s3:" folder

    @property
    def path(self) -> Path | None:
        return Path(self.source) if isinstance(self.source, (str, Path)) else None


@dataclass(frozen=True)
class RewriteOptions:
    policy: str
    keep_float32: tuple[str, ...] = keyword(
        (),
        kind="strings",
        metavar="REGEX",
        help="Keep layers whose whole name or class name matches REGEX in float32 (repeatable); for a "
        "SavedModel without Keras metadata (converted at graph level), nodes whose whole name or op type "
        "matches.",
    )
    # Layers kept float32 by the numeric lint or the search: (layer path, why).
    # Set by the pipeline, not by users (they have keep_float32).
    auto_keep: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        Precision.of(self.policy)  # refuses an unknown policy, naming the valid ones
        for pattern in self.keep_float32:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise MpconvertError(
                    f"--keep-float32 {pattern!r} is not a valid regular expression ({exc})",
                    hint="escape special characters, e.g. --keep-float32 'conv2d_1' or 'block\\d+_.*'",
                ) from None


AUTO_KEEP_MODES = tuple(mode.value for mode in AutoKeepMode)
# A few minutes: far below what node-level bisection costs (52 attempts took
# 16 minutes in onnxmltools PR 543), enough for ~2 log2(L) trials of a
# model of a few hundred layers on 2 cores.
DEFAULT_SEARCH_BUDGET = 180.0
# The search gives up rather than keep more than this share of the
# convertible layers float32: past it, mixed precision buys little.
MAX_SEARCH_SHARE = 0.5
# Calibration rows the lint runs the float32 model on.
LINT_ROWS = 256


@dataclass(frozen=True)
class AutoKeepOptions:
    mode: AutoKeepMode = keyword(
        AutoKeepMode.SEARCH.value,
        name="auto_keep",
        choices=AUTO_KEEP_MODES,
        help="Keep float32 where 16 bits break: lint (what the numeric lint flags), search (also search for the "
        "layers that fix a failing accuracy or agreement check), off (the gate fails and says so).",
    )
    search_budget: float = keyword(
        DEFAULT_SEARCH_BUDGET,
        kind="float",
        minimum=0,
        minimum_open=True,
        rule_note="(seconds)",
        metavar="SECONDS",
        help="Longest the accuracy-driven search may take.",
    )

    def __post_init__(self) -> None:
        check_ranges(self)
        # Every door gives the mode as a string; the stages compare members.
        object.__setattr__(self, "mode", AutoKeepMode(self.mode))


@dataclass(frozen=True)
class ValidateOptions:
    # An .npz path, a "module:function" returning (train, validation), or
    # (Python API) arrays or tf.data.Datasets; see data.resolve_data.
    data: Any = keyword(
        None,
        default_text="generated inputs, no labels",
        help="Labelled data: an .npz with x, y (and x_train, y_train), or module:function returning "
        "(train, validation) -- that form imports and runs your code.",
    )
    # (output name, metric); name None sets every output. Empty: chosen per output.
    metric: tuple[tuple[str | None, str], ...] = keyword(
        (),
        kind="per_output",
        choices=METRICS,
        metavar="[OUTPUT=]METRIC",
        default_text="accuracy for softmax/sigmoid outputs, token_accuracy for sequence outputs with token ids, else mse",
        help="The gate's metric: METRIC for every output, OUTPUT=METRIC for one (repeatable).",
    )
    # Rows drawn when no data is given; enough to see drift, cheap to run.
    generated_samples: int = 64

    def __post_init__(self) -> None:
        check_ranges(self)


# Fine-tuning defaults: a short, gentle run. Adam at 1e-4 moves float32
# master weights a little without undoing the original training.
DEFAULT_FINETUNE_STEPS = 100
DEFAULT_LEARNING_RATE = 1e-4
DEFAULT_BATCH_SIZE = 32


@dataclass(frozen=True)
class FinetuneOptions:
    steps: int | None = keyword(
        None,
        name="finetune_steps",
        kind="int",
        minimum=0,
        default_text=f"{DEFAULT_FINETUNE_STEPS} when the data has a training split, else 0",
        help="Fine-tuning steps, 0 to skip.",
    )
    learning_rate: float = keyword(
        DEFAULT_LEARNING_RATE, kind="float", minimum=0, minimum_open=True, help="Fine-tuning learning rate (Adam)."
    )
    batch_size: int = keyword(
        DEFAULT_BATCH_SIZE, kind="int", minimum=1, help="Rows per fine-tuning step and per evaluation batch."
    )
    loss: str | None = keyword(
        None,
        default_text="the model's saved loss, else one for its output",
        help="Fine-tuning loss, a Keras loss name.",
    )

    def __post_init__(self) -> None:
        check_ranges(self)

    def resolved(self, has_train: bool) -> FinetuneOptions:
        if self.steps is not None:
            return self
        return replace(self, steps=DEFAULT_FINETUNE_STEPS if has_train else 0)


# Tensor Cores want multiples of 8 in float16; TPUs want 128.
DEFAULT_PAD_MULTIPLE = 8
# Padding that adds more than a quarter to the model's multiply-adds costs
# more than Tensor Cores are likely to win back.
DEFAULT_MAX_PAD_OVERHEAD = 0.25


# The speed stage's serving batch: large enough that a Dense(4096) layer is
# bound by arithmetic, not call overhead (speed/measure.py's SPEED_BATCH).
DEFAULT_SPEED_BATCH = 256

# `mpconvert doctor MODEL --budget`: keras.applications-sized models trace
# and run a batch of 256 in seconds on 2 cores; a minute leaves room for
# three of them, each timed a few times.
DEFAULT_DOCTOR_BUDGET_S = 60.0

# Rows of validation input replayed through the padded model (the proof)
# and through each exported artifact (parity).
PARITY_SAMPLES = 256


@dataclass(frozen=True)
class PadOptions:
    multiple: int = keyword(
        DEFAULT_PAD_MULTIPLE,
        name="pad_multiple",
        kind="int",
        minimum=0,
        rule_note="(0 turns padding off)",
        help="Pad channel dimensions to multiples of N for Tensor Cores (128 for TPUs); 0 turns padding off.",
    )
    max_overhead: float = keyword(
        DEFAULT_MAX_PAD_OVERHEAD,
        name="max_pad_overhead",
        kind="float",
        minimum=0,
        help="Largest share of extra multiply-adds padding may add to the model.",
    )
    proof_samples: int = PARITY_SAMPLES

    def __post_init__(self) -> None:
        check_ranges(self)


# tf2onnx 1.17 writes opsets 13 to 18. 17 is the newest TensorRT 8.x and
# most mobile runtimes accept, and bfloat16 coverage is the same as at 18.
DEFAULT_OPSET = 17
ONNX_IO = ("float32", "float16")
MIN_OPSET = 13  # the first opset with bfloat16 in most op schemas
# Protobuf caps one message at 2 GiB; below that, a one-file ONNX export of a 1.07 GB Dense stack still
# peaked at 17.5x its size (every weight copied by freezing, grappler, tf2onnx and serializing), so the
# weights go to external data from well under the limit.
DEFAULT_ONNX_EXTERNAL_DATA = 512 << 20
MAX_OPSET = 18


@dataclass(frozen=True)
class ExportOptions:
    kinds: tuple[str, ...] = keyword(
        DEFAULT_EXPORT,
        name="export",
        kind="kinds",
        choices=EXPORT_KINDS,
        help="Artifacts to write, comma-separated (litert: model.tflite with float16 weights).",
    )
    opset: int = keyword(
        DEFAULT_OPSET,
        kind="int",
        minimum=MIN_OPSET,
        maximum=MAX_OPSET,
        help=f"ONNX opset of the .onnx file (tf2onnx 1.17 writes {MIN_OPSET} to {MAX_OPSET}).",
    )
    onnx_io: str = keyword(
        "float32",
        choices=ONNX_IO,
        help="Element type of the .onnx file's float inputs and outputs: float16 halves what a GPU server "
        "moves (integer and string inputs stay as they are).",
    )
    onnx_external_data: int = keyword(
        DEFAULT_ONNX_EXTERNAL_DATA,
        kind="int",
        minimum=0,
        help="Bytes of weights (as the model holds them) over which a Keras 3 model's ONNX file keeps its "
        "weights in model.onnx.data beside it, written one at a time: protobuf caps the .onnx file and the "
        "TensorFlow graph it is converted from at 2 GiB each.",
    )
    parity_samples: int = PARITY_SAMPLES
    bench_onnx: bool = keyword(
        False,
        kind="bool",
        help="Also time the ONNX file against a float32 ONNX export in ONNX Runtime (costs one more export).",
    )

    def __post_init__(self) -> None:
        check_export_kinds(self.kinds)
        check_opset(self.opset)
        check_ranges(self)


def check_export_kinds(kinds: tuple[str, ...]) -> None:
    """Refuse an empty or unknown choice of artifacts; the --export flag's check too."""
    unknown = [k for k in kinds if k not in EXPORT_KINDS]
    if unknown or not kinds:
        raise MpconvertError(
            f"unknown export kind(s) {', '.join(map(repr, unknown)) or '(none given)'}",
            hint=f"choose from {', '.join(EXPORT_KINDS)}, comma-separated",
        )


def check_opset(opset: int) -> None:
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise MpconvertError(
            f"ONNX opset {opset} is not supported: tf2onnx 1.17 writes opsets {MIN_OPSET} to {MAX_OPSET}",
            hint=f"use --opset {DEFAULT_OPSET}, or --export savedmodel",
        )


@dataclass(frozen=True)
class ConvertOptions:
    """Everything an in-memory conversion needs; writing is SaveOptions'."""

    load: LoadOptions
    rewrite: RewriteOptions
    validate: ValidateOptions = ValidateOptions()
    finetune: FinetuneOptions = FinetuneOptions()
    pad: PadOptions = PadOptions()
    gate: GateOptions = GateOptions()
    auto_keep: AutoKeepOptions = AutoKeepOptions()
    speed: bool = keyword(
        True,
        kind="bool",
        help="Time the converted model against float32 on this machine (a few seconds; report.json speed).",
    )
    speed_batch: int = keyword(
        DEFAULT_SPEED_BATCH,
        kind="int",
        minimum=1,
        metavar="N",
        help="Rows per timed call of the speed stage and --bench-onnx, a serving batch; the data's rows are "
        "repeated when it has fewer.",
    )
    # One seed for the whole conversion: the stages that draw numbers (the
    # generated inputs, fine-tuning) take it as an argument.
    seed: int = keyword(0, kind="int", help="Seed for fine-tuning and generated inputs.")

    def __post_init__(self) -> None:
        check_ranges(self)

    @property
    def precision(self) -> Precision:
        return Precision.of(self.rewrite.policy)


@dataclass(frozen=True)
class SaveOptions:
    out: Path | str  # a folder, or a URL of object storage (s3://bucket/prefix)
    export: ExportOptions = ExportOptions()
    force: bool = False
    # (file name, JSON value) written into the output folder with the report,
    # so they appear with it, whole or not at all (a batch's result key).
    attachments: tuple[tuple[str, Any], ...] = ()
    # The command line that asked for this run, for the report's provenance; None from the Python API.
    command: tuple[str, ...] | None = None
    # Where the written output is recorded as an MLflow run (tracking_options.py); off by default.
    tracking: TrackingOptions = TrackingOptions()

    def __post_init__(self) -> None:
        # A URL stays a string (pathlib would collapse "s3://" into "s3:/"); it is checked
        # here, before any work, so that credentials in it or an http(s) output fail at once.
        if isinstance(self.out, str) and is_url(self.out):
            output_url(self.out)
        elif is_url(self.out):  # pathlib already collapsed it, and "s3:/b/x" must not become a local folder
            raise MpconvertError(
                f"out {self.out} looks like a URL that went through pathlib (which turns // into /)",
                hint="pass an object-storage output as a string, e.g. 's3://bucket/prefix'",
            )
        else:
            object.__setattr__(self, "out", Path(self.out))


def default_out_dir(model_path: Path, policy: str) -> Path:
    """A sibling of the model named after it and the policy.

    For a symlink that is beside the link and after the link's name: the
    user named the link, and its target may sit in a read-only store.
    """
    model_path = Path(model_path)
    stem = model_path.name if model_path.is_dir() else model_path.stem
    return model_path.absolute().parent / f"{stem}_{policy}"


# Every option of a conversion, in the order --help and docs/options.md list
# them; the export's and the gate's are also tables of their own (`check`
# takes the gate's alone).
CONVERSION_KEYWORDS: dict[str, Keyword] = table(
    ValidateOptions,
    RewriteOptions,
    AutoKeepOptions,
    FinetuneOptions,
    PadOptions,
    LoadOptions,
    ConvertOptions,
    GateOptions,
)
EXPORT_KEYWORDS: dict[str, Keyword] = table(ExportOptions)
GATE_KEYWORDS: dict[str, Keyword] = table(GateOptions)
