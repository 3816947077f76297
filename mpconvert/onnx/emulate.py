"""A copy of an ONNX graph that a runtime without 16-bit kernels can run: each 16-bit op computed in float32."""

from __future__ import annotations

import copy
from typing import Any

from mpconvert.onnx.proto import HALF_TYPES, allowed_types, wrap_ops


def promote_16bit_ops(proto: Any) -> tuple[Any, list[str]]:
    """A copy of `proto` with every op on 16-bit floats computed in float32.

    Each op's 16-bit inputs are widened (exactly) and its outputs rounded
    back to their 16-bit type, so the tensors between ops keep the values
    and types of the original graph; only the arithmetic inside each op is
    float32, as on bfloat16 hardware. For checking a file on a runtime that
    lacks 16-bit kernels, not for writing: the file would grow a Cast pair
    per op. Returns (copy, sorted op types promoted).
    """

    def on_16bit(node, schema, bound):
        half = [(n, t) for n, t, dtype in bound if dtype in HALF_TYPES]
        if all("tensor(float)" in allowed_types(schema, t) for _, t in half):
            return [n for n, _ in half]
        return None

    proto = copy.deepcopy(proto)
    return proto, sorted(wrap_ops(proto, on_16bit))
