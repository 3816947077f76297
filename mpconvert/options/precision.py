"""What each mixed-precision policy means, in one value object.

Keras keeps a policy's facts in its `DTypePolicy`; mpconvert keeps the facts
its stages need (16-bit resolution, loss scaling, tolerances, the ONNX
element type) in `Precision`, resolved once from the policy name and passed
to every stage, so no stage tests `policy == "mixed_float16"` itself.

Pure Python: the gate builds one from a stored report without TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from mpconvert.system.errors import MpconvertError

# ONNX TensorProto element types (onnx.TensorProto.FLOAT16 / BFLOAT16),
# written out so that this module needs no onnx import.
_ONNX_FLOAT16 = 10
_ONNX_BFLOAT16 = 16
# An activation above half the format's maximum is flagged by the numeric lint (layers and graph nodes
# alike): unseen rows can be twice as large as calibration rows without anyone noticing.
OVERFLOW_MARGIN = 0.5


@dataclass(frozen=True)
class Precision:
    name: str  # the Keras policy name, e.g. "mixed_float16"
    compute_dtype: str  # "float16" or "bfloat16"; variables stay float32
    # Spacing of the format at 1.0 (2**-mantissa bits). Two scores closer
    # than this are a tie at this precision.
    resolution: float
    max_finite: float
    # float16's narrow exponent range lets small gradients underflow, so it
    # needs loss scaling; bfloat16 has float32's range and does not.
    loss_scaling: bool
    # Artifact parity rtol by artifact kind (see gate.py for the measurements).
    parity_rtol: Mapping[str, float]  # read-only: the table is shared by every conversion
    # Padded vs unpadded model in 16 bits, relative to the output scale: a
    # wider layer may pick another kernel, which rounds differently by a few
    # units in the last place, never more.
    pad_tolerance: float
    onnx_elem_type: int

    @classmethod
    def of(cls, policy: str | Precision) -> Precision:
        if isinstance(policy, Precision):
            return policy
        try:
            return PRECISIONS[policy]
        except (KeyError, TypeError):
            raise MpconvertError(f"unknown policy {policy!r}", hint=f"choose one of {', '.join(POLICIES)}") from None

    def __str__(self) -> str:
        return self.name

    @property
    def overflow_limit(self) -> float:
        """The largest |activation| the numeric lint lets pass in this format (OVERFLOW_MARGIN of its maximum)."""
        return self.max_finite * OVERFLOW_MARGIN

    @property
    def overflows(self) -> bool:
        """Whether activations can leave this format's range (float16 only)."""
        return self.max_finite < 1e38


# The resolution is the format's unit roundoff times two: float16 has 10
# mantissa bits, bfloat16 7. rtol values are multiples of the unit roundoff
# u (float16 2**-11 = 4.9e-4, bfloat16 2**-8 = 3.9e-3); gate.py has the
# measurements behind them.
FLOAT16 = Precision(
    name="mixed_float16",
    compute_dtype="float16",
    resolution=2.0**-10,
    max_finite=65504.0,
    loss_scaling=True,
    parity_rtol=MappingProxyType({"savedmodel": 2e-3, "keras": 2e-3, "onnx": 2e-2, "litert": 2e-2, "openvino": 2e-2}),
    pad_tolerance=2e-3,
    onnx_elem_type=_ONNX_FLOAT16,
)
BFLOAT16 = Precision(
    name="mixed_bfloat16",
    compute_dtype="bfloat16",
    resolution=2.0**-7,
    max_finite=3.3895313892515355e38,
    loss_scaling=False,
    parity_rtol=MappingProxyType(
        {"savedmodel": 1.6e-2, "keras": 1.6e-2, "onnx": 1e-1, "litert": 1e-1, "openvino": 1e-1}
    ),
    pad_tolerance=2e-2,
    onnx_elem_type=_ONNX_BFLOAT16,
)
PRECISIONS = {p.name: p for p in (FLOAT16, BFLOAT16)}
POLICIES = tuple(PRECISIONS)
# Every dtype or policy name that marks a layer as already 16-bit.
SIXTEEN_BIT = POLICIES + tuple(p.compute_dtype for p in PRECISIONS.values())
