"""Artifact parity: a written file against the converted model, on the validation rows and at the batch sizes
it was run at. The gate judges it at conversion, `verify` again where the file will serve.
"""

from __future__ import annotations

from dataclasses import replace

from mpconvert.options.gate import Thresholds
from mpconvert.options.tolerance import Tolerance
from mpconvert.report.checks import PARITY, Check, OutputParity, ParityValues, ServedParity
from mpconvert.report.sections import Artifact, ArtifactOutput


def check_parity(
    artifact: Artifact, thresholds: Thresholds, keras_nonfinite: bool, served_elsewhere: bool = True
) -> Check:
    """The artifact against the converted model on the validation rows, and at the batch sizes it was run at.

    `served_elsewhere`: another serving file (SavedModel, ONNX, LiteRT) was written, so a format that cannot
    express the model is said and passes; without one, the run has nothing to serve and fails.
    """
    check, values = _parity_on_rows(artifact, thresholds, keras_nonfinite, served_elsewhere)
    tolerance = thresholds.tolerance(artifact.kind)
    if artifact.failed or not artifact.batches or tolerance is None:
        return check
    # Each batch on the scale of the artifact's rows (its outputs on the batch are those rows, repeated).
    ref = values.max_abs_ref
    judged = tuple(ServedParity(b, b.error is None and tolerance.admits(b.max_abs_diff, ref)) for b in artifact.batches)
    values = replace(values, batches=judged)
    failing = [j.batch for j in judged if not j.passed]
    sizes = ", ".join(str(j.batch.rows) for j in judged)
    if not failing:
        noted = "".join(f" ({j.batch.rows} rows: {j.batch.note})" for j in judged if j.batch.note)
        return Check(check.name, check.passed, f"{check.message}; serves {sizes} rows{noted}", values)
    why = "; ".join(
        f"cannot serve {b.rows} rows: "
        + (b.error or ("not finite" if b.max_abs_diff is None else f"max abs diff {b.max_abs_diff:.3g}"))
        for b in failing
    )
    return Check(check.name, False, f"{check.message}; {why}", values)


def _parity_on_rows(
    artifact: Artifact, thresholds: Thresholds, keras_nonfinite: bool, served_elsewhere: bool
) -> tuple[Check, ParityValues]:
    kind, diff = artifact.kind, artifact.max_abs_diff
    # Reports written before max_abs_ref existed get the atol alone.
    ref = artifact.max_abs_ref or 0.0
    tolerance = thresholds.tolerance(kind)
    limit = None if tolerance is None else tolerance.limit(ref)
    name = f"{PARITY}: {kind}"
    values = ParityValues(diff, ref, thresholds.atol.get(kind), thresholds.rtol.get(kind), limit, artifact.rows)
    if not artifact.exportable:
        # Not a parity failure: the format cannot express the model, and the other artifacts serve it.
        if served_elsewhere:
            return Check(name, True, f"{artifact.reason} (nothing written)", values), values
        alone = "nothing written, and no other file serves the model: add --export savedmodel"
        return Check(name, False, f"{artifact.reason} ({alone})", values), values
    if artifact.failed:
        return Check(name, False, f"{kind} export failed: {artifact.reason}", values), values
    if tolerance is None or limit is None:
        return Check(name, False, f"no tolerance known for artifact kind {str(kind)!r}", values), values
    if artifact.outputs:
        return _parity_by_output(name, artifact.outputs, tolerance, values, keras_nonfinite)
    rule = f"atol {thresholds.atol[kind]:g} + rtol {thresholds.rtol[kind]:g} x max abs output {ref:.4g}"
    if diff is None:
        # A NaN difference cannot be within any tolerance; say whose it is.
        whose = "the converted Keras model's outputs" if keras_nonfinite else f"{artifact.path}'s outputs"
        return Check(name, False, f"max abs diff is not finite: NaN/inf in {whose} ({rule})", values), values
    passed = tolerance.admits(diff, ref)
    sign = "<=" if passed else ">"
    return Check(name, passed, f"max abs diff {diff:.3g} {sign} limit {limit:.3g} ({rule})", values), values


def _parity_by_output(
    name: str,
    outputs: dict[str, ArtifactOutput],
    tolerance: Tolerance,
    values: ParityValues,
    keras_nonfinite: bool,
) -> tuple[Check, ParityValues]:
    """Each output of the artifact against its own limit (atol + rtol x that output's largest |value|)."""
    judged = {}
    for output, o in outputs.items():
        ref = o.max_abs_ref or 0.0
        judged[output] = OutputParity(o, tolerance.limit(ref), tolerance.admits(o.max_abs_diff, ref))
    failed = [n for n, one in judged.items() if not one.passed]
    parts = []
    for output, one in judged.items():
        diff = one.output.max_abs_diff
        shown = "not finite" if diff is None else f"{diff:.3g}"
        parts.append(f"{output} {shown} {'<=' if one.passed else '>'} {one.limit:.3g}")
    message = "max abs diff per output: " + ", ".join(parts)
    if failed:
        whose = "; NaN/inf in the converted Keras model's outputs" if keras_nonfinite else ""
        message += f" (failing: {', '.join(failed)}{whose})"
    values = replace(values, outputs=judged)
    return Check(name, not failed, message, values), values
