"""Frozen options for every stage, built once at the CLI edge.

Nothing below the CLI sees click: each stage takes the one options object it
needs. Validation of values that click cannot express (regexes, paths that
must not overlap) happens here, once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import MpconvertError

POLICIES = ("mixed_float16", "mixed_bfloat16")
EXPORT_KINDS = ("savedmodel", "onnx")
# What the report lists: a Keras 3 model's savedmodel export also writes model.keras.
ARTIFACT_KINDS = ("savedmodel", "keras", "onnx")
METRICS = ("accuracy", "mse")

# One percentage point of accuracy: small enough to catch a real regression,
# large enough that 16-bit rounding on a few hundred samples does not trip it.
DEFAULT_MAX_DROP = 0.01


@dataclass(frozen=True)
class LoadOptions:
    path: Path
    unsafe_deserialization: bool = False


@dataclass(frozen=True)
class RewriteOptions:
    policy: str
    keep_float32: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise MpconvertError(
                f"unknown policy {self.policy!r}",
                hint=f"choose one of {', '.join(POLICIES)}",
            )
        for pattern in self.keep_float32:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise MpconvertError(
                    f"--keep-float32 {pattern!r} is not a valid regular expression ({exc})",
                    hint="escape special characters, e.g. --keep-float32 'conv2d_1' or 'block\\d+_.*'",
                ) from None


@dataclass(frozen=True)
class ValidateOptions:
    # An .npz path, or a "module:function" returning (train, validation)
    data: Path | str | None = None
    metric: str | None = None  # None: accuracy for classifiers, mse otherwise
    max_drop: float = DEFAULT_MAX_DROP
    # Rows drawn when no data is given; enough to see drift, cheap to run.
    generated_samples: int = 64
    seed: int = 0


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

    def resolved(self, has_train: bool) -> "FinetuneOptions":
        if self.steps is not None:
            return self
        return replace(self, steps=DEFAULT_FINETUNE_STEPS if has_train else 0)


# Tensor Cores want multiples of 8 in float16; TPUs want 128.
DEFAULT_PAD_MULTIPLE = 8
# Padding that adds more than a quarter to the model's multiply-adds costs
# more than Tensor Cores are likely to win back.
DEFAULT_MAX_PAD_OVERHEAD = 0.25


@dataclass(frozen=True)
class PadOptions:
    multiple: int = DEFAULT_PAD_MULTIPLE  # 0 turns padding off
    max_overhead: float = DEFAULT_MAX_PAD_OVERHEAD


@dataclass(frozen=True)
class ExportOptions:
    kinds: tuple[str, ...] = EXPORT_KINDS
    # Rows of validation input replayed through each exported artifact.
    parity_samples: int = 256


@dataclass(frozen=True)
class GateOptions:
    """Gate thresholds given on the command line.

    None (or no entry) keeps the base value: the policy's default for a
    conversion, the value stored in the report for `mpconvert check`. The
    accuracy budget of a conversion is ValidateOptions.max_drop; here
    max_drop only overrides a stored report's.
    """

    max_drop: float | None = None
    min_agreement: float | None = None
    # (artifact kind, value) in the order given, later entries winning; kind
    # None applies to every kind.
    atol: tuple[tuple[str | None, float], ...] = ()
    rtol: tuple[tuple[str | None, float], ...] = ()
    max_regression: float | None = None
    baseline: Path | None = None  # an earlier run's report.json


@dataclass(frozen=True)
class ConvertOptions:
    load: LoadOptions
    rewrite: RewriteOptions
    validate: ValidateOptions
    export: ExportOptions
    out: Path
    finetune: FinetuneOptions = FinetuneOptions()
    pad: PadOptions = PadOptions()
    gate: GateOptions = GateOptions()
    force: bool = False
    quiet: bool = False


def default_out_dir(model_path: Path, policy: str) -> Path:
    """A sibling of the model named after it and the policy."""
    stem = model_path.name if model_path.is_dir() else model_path.stem
    return model_path.resolve().parent / f"{stem}_{policy}"
