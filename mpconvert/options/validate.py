"""What a conversion is judged on: the data and each output's metric (`ValidateOptions`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from mpconvert.options.keywords import check_ranges, keyword


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


METRICS = tuple(metric.value for metric in Metric)

# Rows of validation input replayed through the padded model (the proof)
# and through each exported artifact (parity).
PARITY_SAMPLES = 256


@dataclass(frozen=True)
class ValidateOptions:
    # An .npz path, a "module:function" returning (train, validation), or
    # (Python API) arrays or tf.data.Datasets; see data.resolve_data.
    data: Any = keyword(
        None,
        file=True,
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
