"""Frozen options for every stage, built once at the CLI edge.

Nothing below the CLI sees click: each stage takes the one options object it
needs. Validation of values that click cannot express (regexes, paths that
must not overlap) happens here, once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .errors import MpconvertError
from .precision import Precision


def _require(ok: bool, name: str, value: object, rule: str) -> None:
    """The Python API's counterpart of click's range checks, with the same wording."""
    if not ok:
        raise MpconvertError(f"{name}={value!r} is invalid: it must be {rule}", hint=f"pass a {name} that is {rule}")


EXPORT_KINDS = ("savedmodel", "onnx")
# What the report lists: a Keras 3 model's savedmodel export also writes model.keras.
ARTIFACT_KINDS = ("savedmodel", "keras", "onnx")
METRICS = ("accuracy", "mse")

# One percentage point of accuracy: small enough to catch a real regression,
# large enough that 16-bit rounding on a few hundred samples does not trip it.
DEFAULT_MAX_DROP = 0.01


@dataclass(frozen=True)
class LoadOptions:
    # A model file or folder, or a live keras / tf_keras model (Python API),
    # which is read but never modified.
    source: Any
    unsafe_deserialization: bool = False
    # Modules imported before loading, so that their
    # register_keras_serializable classes are found (runs their code).
    imports: tuple[str, ...] = ()
    custom_objects: Any = None  # Python API: {name: class}, like Keras's own argument

    @property
    def path(self) -> Path | None:
        return Path(self.source) if isinstance(self.source, (str, Path)) else None


@dataclass(frozen=True)
class RewriteOptions:
    policy: str
    keep_float32: tuple[str, ...] = ()
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


AUTO_KEEP_MODES = ("off", "lint", "search")
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
    mode: str = "search"  # off: today's behaviour; lint: keep what the lint flags; search: also search
    search_budget: float = DEFAULT_SEARCH_BUDGET

    def __post_init__(self) -> None:
        _require(self.mode in AUTO_KEEP_MODES, "auto_keep", self.mode, f"one of {', '.join(AUTO_KEEP_MODES)}")
        _require(self.search_budget > 0, "search_budget", self.search_budget, "a number of seconds > 0")


@dataclass(frozen=True)
class ValidateOptions:
    # An .npz path, a "module:function" returning (train, validation), or
    # (Python API) arrays or tf.data.Datasets; see data.resolve_data.
    data: Any = None
    metric: str | None = None  # None: accuracy for classifiers, mse otherwise
    # Rows drawn when no data is given; enough to see drift, cheap to run.
    generated_samples: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        _require(self.metric in (None, *METRICS), "metric", self.metric, f"one of {', '.join(METRICS)} or None")


# Fine-tuning defaults: a short, gentle run. Adam at 1e-4 moves float32
# master weights a little without undoing the original training.
DEFAULT_FINETUNE_STEPS = 100
DEFAULT_LEARNING_RATE = 1e-4
DEFAULT_BATCH_SIZE = 32


@dataclass(frozen=True)
class FinetuneOptions:
    # None: DEFAULT_FINETUNE_STEPS when the data has a training split, else 0
    steps: int | None = None
    learning_rate: float = DEFAULT_LEARNING_RATE
    batch_size: int = DEFAULT_BATCH_SIZE
    seed: int = 0
    loss: str | None = None  # None: the model's saved loss, else one for its output

    def __post_init__(self) -> None:
        _require(self.steps is None or self.steps >= 0, "finetune_steps", self.steps, "an integer >= 0 or None")
        _require(self.learning_rate > 0, "learning_rate", self.learning_rate, "a number > 0")
        _require(self.batch_size >= 1, "batch_size", self.batch_size, "an integer >= 1")

    def resolved(self, has_train: bool) -> FinetuneOptions:
        if self.steps is not None:
            return self
        return replace(self, steps=DEFAULT_FINETUNE_STEPS if has_train else 0)


# Tensor Cores want multiples of 8 in float16; TPUs want 128.
DEFAULT_PAD_MULTIPLE = 8
# Padding that adds more than a quarter to the model's multiply-adds costs
# more than Tensor Cores are likely to win back.
DEFAULT_MAX_PAD_OVERHEAD = 0.25


# Rows of validation input replayed through the padded model (the proof)
# and through each exported artifact (parity).
PARITY_SAMPLES = 256


@dataclass(frozen=True)
class PadOptions:
    multiple: int = DEFAULT_PAD_MULTIPLE  # 0 turns padding off
    max_overhead: float = DEFAULT_MAX_PAD_OVERHEAD
    proof_samples: int = PARITY_SAMPLES

    def __post_init__(self) -> None:
        _require(self.multiple >= 0, "pad_multiple", self.multiple, "an integer >= 0 (0 turns padding off)")
        _require(self.max_overhead >= 0, "max_pad_overhead", self.max_overhead, "a number >= 0")


# tf2onnx 1.17 writes opsets 13 to 18. 17 is the newest TensorRT 8.x and
# most mobile runtimes accept, and bfloat16 coverage is the same as at 18.
DEFAULT_OPSET = 17
MIN_OPSET = 13  # the first opset with bfloat16 in most op schemas
MAX_OPSET = 18


@dataclass(frozen=True)
class ExportOptions:
    kinds: tuple[str, ...] = EXPORT_KINDS
    opset: int = DEFAULT_OPSET
    parity_samples: int = PARITY_SAMPLES
    # Time the ONNX file against a float32 export in ONNX Runtime (one more export).
    bench_onnx: bool = False

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in EXPORT_KINDS]
        if unknown or not self.kinds:
            raise MpconvertError(
                f"unknown export kind(s) {', '.join(map(repr, unknown)) or '(none given)'}",
                hint=f"choose from {', '.join(EXPORT_KINDS)}",
            )
        check_opset(self.opset)


def check_opset(opset: int) -> None:
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise MpconvertError(
            f"ONNX opset {opset} is not supported: tf2onnx 1.17 writes opsets {MIN_OPSET} to {MAX_OPSET}",
            hint=f"use --opset {DEFAULT_OPSET}, or --export savedmodel",
        )


@dataclass(frozen=True)
class GateOptions:
    """Gate thresholds given on the command line or to the Python API.

    None (or no entry) keeps the base value: the policy's default for a
    conversion (max_drop: DEFAULT_MAX_DROP), the value stored in the report
    for `mpconvert check`. This is the one place a budget is given.
    """

    max_drop: float | None = None
    min_agreement: float | None = None
    # (artifact kind, value) in the order given, later entries winning; kind
    # None applies to every kind.
    atol: tuple[tuple[str | None, float], ...] = ()
    rtol: tuple[tuple[str | None, float], ...] = ()
    max_regression: float | None = None
    baseline: Path | None = None  # an earlier run's report.json
    # Smallest accepted float32 time / converted time (speed.py); None: not judged.
    min_speedup: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_drop", "max_regression"):
            value = getattr(self, name)
            _require(value is None or value >= 0, name, value, "a number >= 0 or None")
        speedup = self.min_speedup
        _require(speedup is None or speedup > 0, "min_speedup", speedup, "a number > 0 or None")
        agreement = self.min_agreement
        _require(agreement is None or 0 <= agreement <= 1, "min_agreement", agreement, "between 0 and 1, or None")
        for name in ("atol", "rtol"):
            for kind, value in getattr(self, name):
                _require(kind is None or kind in ARTIFACT_KINDS, name, kind, f"one of {', '.join(ARTIFACT_KINDS)}")
                _require(value >= 0, name, value, "a number >= 0")


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
    # Time the converted model against the float32 original here (a few seconds).
    speed: bool = True

    @property
    def precision(self) -> Precision:
        return Precision.of(self.rewrite.policy)


@dataclass(frozen=True)
class SaveOptions:
    out: Path
    export: ExportOptions = ExportOptions()
    force: bool = False
    # (file name, JSON value) written into the output folder with the report,
    # so they appear with it, whole or not at all (a batch's result key).
    attachments: tuple[tuple[str, Any], ...] = ()


def default_out_dir(model_path: Path, policy: str) -> Path:
    """A sibling of the model named after it and the policy.

    For a symlink that is beside the link and after the link's name: the
    user named the link, and its target may sit in a read-only store.
    """
    model_path = Path(model_path)
    stem = model_path.name if model_path.is_dir() else model_path.stem
    return model_path.absolute().parent / f"{stem}_{policy}"
