"""The padding stage: pad where the plan allows, and prove the function unchanged."""

from __future__ import annotations

import copy
import gc
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mpconvert.keras.configs import model_config, policy_name
from mpconvert.keras.frameworks import Framework
from mpconvert.keras.pad.apply import apply_padding
from mpconvert.keras.pad.live import as_functional, plan_model_padding
from mpconvert.keras.state import rebuild
from mpconvert.options.pad import PadOptions
from mpconvert.options.precision import SIXTEEN_BIT, Precision
from mpconvert.report.compare import compare
from mpconvert.report.sections import PaddingReport
from mpconvert.report.sections.stages import (
    NOT_TRIED,
    NOTHING_TO_PAD,
    PADDED,
    UNPADDED,
    SkippedDim,
    padding_failures,
)
from mpconvert.runners.keras import forward


@dataclass(frozen=True)
class Padding:
    model: Any  # the model to export: padded, or the unpadded one when the proof failed
    report: PaddingReport


# The padding logic is exact: in float32 the padded model must agree to
# rounding. In 16 bits a wider layer may pick another kernel, which rounds
# differently (Precision.pad_tolerance).
TOLERANCE_FLOAT32 = 1e-6


# Models with more weights (float32 bytes) are not padded: the proof's two extra copies would take a
# conversion past 3x the model's size in memory (with the float32 original and the converted model).
PROOF_MAX_BYTES = 512 << 20


def _float32_twin(model: Any, framework: Framework) -> Any:
    """The same model (weights included) with every 16-bit policy set to float32."""
    config = copy.deepcopy(model_config(model))

    def strip(value: Any) -> None:
        if isinstance(value, dict):
            if policy_name(value.get("dtype")) in SIXTEEN_BIT:
                value["dtype"] = "float32"
            for item in value.values():
                strip(item)
        elif isinstance(value, list):
            for item in value:
                strip(item)

    strip(config)
    return rebuild(framework, model, config)


def _nothing_to_pad(skipped: tuple[SkippedDim, ...], multiple: int) -> str:
    """Why the plan padded nothing: every dimension a multiple already, or left as it is with its reason."""
    if not skipped:
        return f"{NOTHING_TO_PAD}: every channel dimension is already a multiple of {multiple}"
    named = "; ".join(f"{s.layer} {s.dim} {s.width}: {s.reason}" for s in skipped[:3])
    more = f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""
    return (
        f"{NOTHING_TO_PAD}: every channel dimension is a multiple of {multiple} already or left as it is "
        f"({named}{more})"
    )


def pad(
    model: Any, framework: Framework, options: PadOptions, inputs: list[np.ndarray], precision: Precision
) -> Padding:
    """Pad `model` where it is safe and cheap, and prove the function unchanged."""
    functional = as_functional(model, framework)
    plan = plan_model_padding(functional, framework, options)
    report = PaddingReport(
        multiple=options.multiple,
        max_overhead=options.max_overhead,
        padded=plan.padded,
        skipped=plan.skipped,
        flops_overhead=round(plan.flops_overhead, 6),
        tolerance={"float32": TOLERANCE_FLOAT32, precision.name: precision.pad_tolerance},
        exported=UNPADDED,
    )
    if plan.empty:
        return Padding(model, replace(report, reason=_nothing_to_pad(plan.skipped, options.multiple)))
    weights = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    if weights > PROOF_MAX_BYTES:
        reason = (
            f"{NOT_TRIED}: the model's weights ({weights / 1e9:.2f} GB) are over {PROOF_MAX_BYTES >> 20} MiB, and "
            "its proof holds two more copies of them beside the float32 and the converted model"
        )
        return Padding(model, replace(report, reason=reason))
    # The float32 twins first, freed before the padded 16-bit model is built: two extra copies at most.
    twin = _float32_twin(functional, framework)
    padded_twin = apply_padding(twin, framework, plan)
    exact = compare(forward(twin, inputs), forward(padded_twin, inputs)).max_abs_diff
    del twin, padded_twin
    gc.collect()
    padded = apply_padding(functional, framework, plan)
    # Both differences are judged on the unpadded 16-bit model's scale (padding_failures).
    sixteen = compare(forward(functional, inputs), forward(padded, inputs))
    largest = sixteen.max_abs_ref
    report = replace(report, float32_max_abs_diff=exact, max_abs_diff=sixteen.max_abs_diff, max_abs_ref=largest)
    assert report.tolerance is not None
    failures = padding_failures(exact, sixteen.max_abs_diff, report.tolerance, precision.name, largest)
    if failures:
        return Padding(
            model, replace(report, passed=False, reason="padding changed the outputs: " + "; ".join(failures))
        )
    return Padding(padded, replace(report, exported=PADDED))
