"""The one comparator: hand-computed differences and limits, NaN and shape rules, and the gate judging by the same rule."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from mpconvert.data.signature import Signature, TensorSpec
from mpconvert.export.artifacts import parity
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.options.gate import Thresholds
from mpconvert.options.tolerance import Tolerance
from mpconvert.report.compare import compare
from mpconvert.report.parity import check_parity
from mpconvert.report.sections.details import OnnxDetails
from mpconvert.system.digests import Digest


def arrays(*values):
    return [np.asarray(v, dtype=np.float32) for v in values]


def test_a_difference_over_atol_plus_rtol_times_the_largest_reference_fails():
    found = compare(arrays([1, 2]), arrays([1.5, 2]), Tolerance(atol=0.1, rtol=0.1))
    # |1 - 1.5| = 0.5; limit 0.1 + 0.1 x max(|1|, |2|) = 0.3
    assert found.max_abs_diff == 0.5
    assert found.max_abs_ref == 2.0
    assert math.isclose(found.limit, 0.3)
    assert not found.passed
    assert not found.outputs[0].passed


def test_a_difference_within_the_limit_passes_and_a_negative_reference_counts_by_its_magnitude():
    found = compare(arrays([1, -2]), arrays([1.25, -2]), Tolerance(atol=0.1, rtol=0.1))
    assert found.max_abs_diff == 0.25 and found.max_abs_ref == 2.0
    assert found.passed


def test_the_float32_rounding_limit_is_relative_to_a_scale_of_at_least_one():
    small = compare(arrays([0.5]), arrays([0.5]), Tolerance.float32_rounding())
    large = compare(arrays([-300.0]), arrays([-300.0]), Tolerance.float32_rounding())
    assert small.limit == 1e-6  # max(1, 0.5) = 1
    assert math.isclose(large.limit, 3e-4)
    assert small.passed and large.passed and small.max_abs_diff == 0.0


def test_nan_where_the_reference_has_nan_counts_as_equal_only_under_the_proofs_rule():
    expected, got = arrays([1, np.nan, np.inf]), arrays([1, np.nan, np.inf])
    proof = compare(expected, got, Tolerance.float32_rounding())
    assert proof.max_abs_diff == 0.0 and proof.passed
    # Figures for the gate: a NaN anywhere is a difference that is not finite, stored as None, and fails.
    figures = compare(expected, got, Tolerance(atol=1.0))
    assert figures.max_abs_diff is None and not figures.passed
    assert figures.shown == "not finite"


def test_nan_only_in_the_output_fails_under_every_rule():
    found = compare(arrays([1, 2]), arrays([1, np.nan]), Tolerance.float32_rounding())
    assert found.max_abs_diff is None and not found.passed
    # The reference's scale counts its finite values only.
    assert compare(arrays([np.nan, -4]), arrays([np.nan, -4]), Tolerance.float32_rounding()).max_abs_ref == 4.0


def test_a_shape_mismatch_or_a_missing_output_fails_and_says_so():
    found = compare(arrays([[1, 2]]), arrays([1, 2]), Tolerance(atol=10.0))
    assert found.max_abs_diff is None and not found.passed
    assert found.outputs[0].shapes == ((1, 2), (2,))
    assert found.shown == "not comparable (shape (2,) for (1, 2))"
    missing = compare(arrays([1], [2]), arrays([1]), Tolerance(atol=10.0))
    assert [o.passed for o in missing.outputs] == [True, False]
    assert not missing.passed


def test_each_output_is_judged_on_its_own_scale_and_all_together_on_the_largest():
    found = compare(arrays([0.0, 1.0], [100.0]), arrays([0.0, 1.5], [100.5]), Tolerance(rtol=0.01))
    first, second = found.outputs
    assert (first.max_abs_diff, first.limit, first.passed) == (0.5, 0.01, False)
    assert (second.max_abs_diff, second.limit, second.passed) == (0.5, 1.0, True)
    # Together: the largest difference against the largest reference's limit.
    assert (found.max_abs_diff, found.max_abs_ref, found.limit, found.passed) == (0.5, 100.0, 1.0, True)


def test_the_gate_judges_stored_figures_by_the_comparators_limit():
    thresholds = Thresholds.defaults("mixed_float16")
    tolerance = thresholds.tolerance(ArtifactKind.ONNX)
    assert tolerance == Tolerance(thresholds.atol["onnx"], thresholds.rtol["onnx"])
    signature = Signature((TensorSpec("x", (None, 2), "float32"),), (TensorSpec("y", (None, 2), "float32"),))
    expected = [np.asarray([[1.0, -2.0]])]  # float64: a difference exactly at the limit stays at it
    limit = tolerance.limit(2.0)
    for delta, passes in ((limit, True), (limit * 1.01, False)):
        got = [expected[0] + np.asarray([[0.0, delta]])]
        compared = compare(expected, got, tolerance)
        artifact = parity(
            ArtifactKind.ONNX,
            Path("model.onnx"),
            expected,
            got,
            "onnxruntime",
            OnnxDetails(),
            signature,
            written=Digest("0" * 64, 1, 1),
        )
        # The artifact stores the comparator's figures; the gate re-judges them to the same verdict and limit.
        assert artifact.max_abs_diff == compared.max_abs_diff and artifact.max_abs_ref == compared.max_abs_ref == 2.0
        check = check_parity(artifact, thresholds, keras_nonfinite=False)
        assert check.passed is compared.passed is passes
        assert check.values.limit == compared.limit
