"""A numeric lint: which layers 16 bits would break, found on the float32 model before converting.

The float32 model runs once on calibration rows (the validation inputs, else
generated ones) with every top-level layer's output recorded, and each layer
is checked, with its numbers, for what users of every converter report:

* overflow: outputs beyond the format's largest value (float16: 65504), with
  a margin for rows not seen, become inf and then NaN. The layer that reads
  such an output overflows too when it computes in 16 bits (its input is
  cast first), so it is kept with it.
* weights and config constants (a -1e9 mask fill) beyond that range, and
  epsilons below the smallest value the format holds (1e-12 in a float16
  LayerNormalization is 0, and the variance divides by it);
* information loss without overflow: a layer whose output varies across rows
  by less than the 16-bit spacing at its magnitude (small differences riding
  on a large value: 3000 + noise has a float16 spacing of 2), or float inputs
  holding integers beyond the format's exact range (2048 for float16, 256 for
  bfloat16). Its readers lose the information too, so they are kept with it.

Layers that already compute in float32 inside (Keras 3's normalization
layers cast their inputs up) are not flagged for intermediate overflow or
epsilons: that is checked by running the layer class under the policy on
inputs whose squares overflow, not assumed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from mpconvert.keras.configs import NORMALIZATION_LAYERS
from mpconvert.keras.frameworks import Framework
from mpconvert.keras.trace import trace
from mpconvert.options.precision import Precision
from mpconvert.report.sections import Finding, Lint

# Information is lost when a unit's spread across rows is below this many
# 16-bit spacings at its magnitude; a layer is flagged when most units are.
SPREAD_SPACINGS = 2.0
LOSSY_UNIT_SHARE = 0.5
# ... and only on large values: untrained nets have near-constant units too
# (EfficientNetB0's squeeze-excite gates sit at 0.5 +- 8e-7 with random
# weights), where the variation rounded away carries nothing.
LARGE_VALUE = 1.0
# Integers are exact in float16 up to 2**11 and in bfloat16 up to 2**8.
EXACT_INTEGERS = {"float16": 2048, "bfloat16": 256}
# The smallest positive value each format holds (float16's subnormal 2**-24).
SMALLEST = {"float16": 2.0**-24, "bfloat16": 9.2e-41}


def _float_config_values(config: Any, path: str = "") -> list[tuple[str, float]]:
    found = []
    if isinstance(config, dict):
        for key, value in config.items():
            if key in ("dtype", "seed", "build_config"):
                continue
            found += _float_config_values(value, f"{path}.{key}" if path else key)
    elif isinstance(config, (list, tuple)):
        for i, value in enumerate(config):
            found += _float_config_values(value, f"{path}[{i}]")
    elif isinstance(config, float):
        found.append((path, config))
    return found


@functools.cache
def computes_in_float32(framework: Framework, class_name: str, policy: str) -> bool:
    """Whether a normalization layer class survives inputs whose squares overflow 16 bits.

    Checked by running it (built from its default config) under the policy on
    values of +-1000 (squares 1e6 > 65504) against float32.
    """
    cls = getattr(framework.module.layers, class_name, None)
    if cls is None:
        return False
    x = np.tile(np.array([[1000.0, -1000.0, 500.0, -500.0]], np.float32), (4, 1))
    try:
        reference = np.asarray(cls(dtype="float32")(x, training=False), np.float32)
        mixed = np.asarray(cls(dtype=policy)(x, training=False), np.float32)
    except Exception:
        return False
    return bool(np.isfinite(mixed).all() and np.allclose(mixed, reference, rtol=0.05, atol=0.05))


def _spacing(magnitude: np.ndarray, precision: Precision) -> np.ndarray:
    # The distance between neighbouring 16-bit values at a magnitude.
    return np.exp2(np.floor(np.log2(np.maximum(magnitude, 1e-30)))) * precision.resolution


def _lossy_share(values: np.ndarray, precision: Precision) -> tuple[float, float, float]:
    """(share of units whose spread is below the 16-bit spacing, a typical magnitude, a typical spread)."""
    rows = values.reshape(len(values), -1).astype(np.float64)
    mean = np.abs(rows.mean(axis=0))
    spread = rows.std(axis=0)
    varying = spread > 0
    if not varying.any():
        return 0.0, 0.0, 0.0
    lossy = varying & (mean >= LARGE_VALUE) & (spread < SPREAD_SPACINGS * _spacing(mean, precision))
    return float(lossy[varying].mean()), float(np.median(mean[varying])), float(np.median(spread[varying]))


def _information_loss(values: np.ndarray, precision: Precision) -> str | None:
    share, magnitude, spread = _lossy_share(values, precision)
    if share < LOSSY_UNIT_SHARE or len(values) < 2:
        return None
    spacing = float(_spacing(np.array(magnitude), precision))
    return (
        f"varies by {spread:.3g} around {magnitude:.4g}, below {precision.compute_dtype}'s spacing {spacing:.3g} there"
    )


def _lint_input(name: str, value: np.ndarray, precision: Precision, flag_readers: Callable) -> None:
    """A float input's readers cast it to 16 bits first: what the input carries must survive that."""
    dtype = precision.compute_dtype
    largest = float(np.abs(value[np.isfinite(value)]).max(initial=0.0))
    if largest > precision.overflow_limit:
        flag_readers(
            name,
            "input overflow",
            f"input {name!r} holds values up to {largest:.3g} > {dtype} max {precision.max_finite:g}",
            max=largest,
        )
        return
    if np.all(np.equal(np.mod(value, 1), 0)) and largest > EXACT_INTEGERS[dtype]:
        flag_readers(
            name,
            "input information loss",
            f"input {name!r} holds integers up to {largest:.6g}, beyond {dtype}'s exact {EXACT_INTEGERS[dtype]}",
            max=largest,
        )
        return
    lost = _information_loss(value, precision)
    if lost:
        flag_readers(name, "input information loss", f"input {name!r} {lost}")


def _floats(values: Any) -> list[np.ndarray]:
    return [np.asarray(v, dtype=np.float32) for v in values if np.issubdtype(np.asarray(v).dtype, np.floating)]


def _largest(values: list[np.ndarray]) -> float:
    return max((float(np.abs(v[np.isfinite(v)]).max(initial=0.0)) for v in values), default=0.0)


def lint(
    model: Any, framework: Framework, precision: Precision, inputs: list[np.ndarray], candidates: set[str]
) -> Lint:
    """Findings for the layers the plan would convert (`candidates`, by path), on the float32 model.

    Every layer call is checked (nested models' layers under their paths,
    a shared layer on each of its calls), on every output tensor.
    """
    # Outputs only: each call's input is its source's output, and holding
    # both would double what the calibration rows take in memory.
    calls = trace(model, inputs, record_inputs=False)
    first_output: dict[str, Any] = {}
    readers: dict[str, list[str]] = {}
    for call in calls:
        first_output.setdefault(call.path, call.outputs[0] if call.outputs else None)
        for source in dict.fromkeys(call.sources):
            readers.setdefault(source, []).append(call.path)
    limit = precision.overflow_limit
    dtype = precision.compute_dtype
    findings: dict[tuple[str, str], Finding] = {}

    def flag(layer: str, kind: str, message: str, **values: Any) -> None:
        if layer in candidates:
            findings.setdefault((layer, kind), Finding(layer, kind, message, values))

    def flag_readers(source: str, kind: str, message: str, **values: Any) -> None:
        for reader in readers.get(source, []):
            flag(reader, kind, message, source=source, **values)

    for call in calls:
        name, cls = call.path, call.class_name
        if call.layer is None:  # a model input
            for value in _floats(call.outputs):
                _lint_input(name, value, precision, flag_readers)
            continue
        normalizing = cls in NORMALIZATION_LAYERS and computes_in_float32(framework, cls, precision.name)
        if call.index == 0:  # what the layer holds is the same on every call
            _lint_held(call.layer, name, cls, precision, normalizing, flag)
        if cls in NORMALIZATION_LAYERS and not normalizing:
            seen = first_output.get(call.sources[0]) if call.sources else None
            square = _largest(_floats([seen] if seen is not None else [])) ** 2
            if square > limit:
                flag(
                    name,
                    "intermediate overflow",
                    f"squares its input (up to {square:.3g}) > {dtype} max {precision.max_finite:g}",
                    max=square,
                )
        outputs = _floats(call.outputs)
        largest = _largest(outputs)
        if largest > limit:
            message = f"output max {largest:.3g} > {dtype} max {precision.max_finite:g}"
            flag(name, "overflow", message, max=largest)
            flag_readers(
                name,
                "input overflow",
                f"reads {name!r}: input max {largest:.3g} > {dtype} max {precision.max_finite:g}",
                max=largest,
            )
            continue
        lost = next(filter(None, (_information_loss(v, precision) for v in outputs)), None)
        if lost:
            flag(name, "information loss", f"output {lost}")
            flag_readers(name, "input information loss", f"reads {name!r}, whose output {lost}")
    return Lint(len(inputs[0]), tuple(findings.values()))


def _lint_held(layer: Any, name: str, cls: str, precision: Precision, normalizing: bool, flag: Callable) -> None:
    """Config constants and weights beyond the 16-bit range, and epsilons it cannot hold."""
    if not hasattr(layer, "get_weights"):  # a plain operation (keras.ops.not_equal for a mask): holds nothing
        return
    dtype = precision.compute_dtype
    try:
        config = layer.get_config()
    except Exception:  # a custom layer without get_config: nothing to read
        config = {}
    for path, number in _float_config_values(config):
        if abs(number) > precision.max_finite:
            flag(
                name,
                "constant",
                f"config {path} = {number:g} overflows {dtype} (max {precision.max_finite:g})",
                value=number,
            )
        elif "epsilon" in path and 0 < number < SMALLEST[dtype] and not normalizing:
            flag(name, "epsilon", f"epsilon {number:g} is 0 in {dtype} (smallest {SMALLEST[dtype]:g})", value=number)
    weights = [w for w in layer.get_weights() if np.issubdtype(w.dtype, np.floating) and w.size]
    biggest = max((float(np.abs(w).max()) for w in weights), default=0.0)
    if biggest > precision.max_finite:
        flag(name, "weights", f"weights up to {biggest:.3g} > {dtype} max {precision.max_finite:g}", max=biggest)
