"""Padding channel dimensions for Tensor Cores, and its proof (`PadOptions`)."""

from __future__ import annotations

from dataclasses import dataclass

from mpconvert.options.keywords import check_ranges, keyword
from mpconvert.options.validate import PARITY_SAMPLES

# Tensor Cores want multiples of 8 in float16; TPUs want 128.
DEFAULT_PAD_MULTIPLE = 8
# Padding that adds more than a quarter to the model's multiply-adds costs
# more than Tensor Cores are likely to win back.
DEFAULT_MAX_PAD_OVERHEAD = 0.25


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
