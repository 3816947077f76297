"""The accuracy gate and its numbers, against hand-computed values."""

import numpy as np
import pytest

from mpconvert.data.rows import Split, Task
from mpconvert.data.signature import TensorSpec
from mpconvert.report.gate import check_accuracy, check_agreement
from mpconvert.report.measure import Validation, compare

SOFTMAX = Task("softmax", TensorSpec("p", (None, 3), "float32"))
REGRESSION = Task("regression", TensorSpec("v", (None, 1), "float32"))


def probs(classes):
    return np.eye(3, dtype=np.float32)[classes]


def gate(reference, converted, labels, max_drop, task=SOFTMAX, metric="accuracy", min_agreement=0.95):
    """The measurements, the gate's accuracy verdict on them as `passed`,
    and its agreement check as `agreement_check`. `labels` None: generated data."""
    rows = len(reference)
    split = Split((np.zeros((rows, 2), np.float32),), None if labels is None else np.asarray(labels))
    v = compare([reference], [converted], split, task, metric, "npz" if labels is not None else "generated")
    return Judged(v, check_accuracy(v, max_drop).passed, check_agreement(v, min_agreement))


class Judged:
    def __init__(self, validation, passed, agreement_check=None):
        self.__dict__.update(validation.as_dict())
        self.passed = passed
        self.agreement_check = agreement_check


def test_accuracy_drop_and_agreement_are_hand_computed():
    # reference right on 3 of 4 (0.75); converted right on 2 of 4 (0.5)
    labels = [0, 1, 2, 0]
    v = gate(probs([0, 1, 2, 1]), probs([0, 1, 1, 1]), labels, max_drop=0.25)
    assert (v.reference, v.converted) == (0.75, 0.5)
    assert v.drop == 0.25 and v.passed  # exactly at the budget passes
    assert v.agreement == 0.75  # predictions differ on one sample of four
    assert v.max_abs_diff == 1.0


def test_a_drop_just_over_the_budget_fails():
    v = gate(probs([0, 1, 2, 1]), probs([0, 1, 1, 1]), [0, 1, 2, 0], max_drop=0.2499)
    assert not v.passed


def test_float_rounding_does_not_fail_a_drop_equal_to_the_budget():
    # 0.96 - 0.95 is 0.010000000000000009 in binary floating point
    labels = np.zeros(100, int)
    ref = probs(np.r_[np.zeros(96, int), np.ones(4, int)])
    conv = probs(np.r_[np.zeros(95, int), np.ones(5, int)])
    v = gate(ref, conv, labels, max_drop=0.01)
    assert v.drop == pytest.approx(0.01) and v.passed


def test_mse_drop_is_the_increase_in_error():
    labels = np.array([[1.0], [2.0]], np.float32)
    ref = np.array([[1.0], [2.0]], np.float32)  # mse 0
    conv = np.array([[1.5], [2.0]], np.float32)  # mse (0.25 + 0) / 2 = 0.125
    v = gate(ref, conv, labels, max_drop=0.1, task=REGRESSION, metric="mse")
    assert (v.reference, v.converted, v.drop) == (0.0, 0.125, 0.125)
    assert not v.passed and v.agreement is None


def test_nan_outputs_fail_even_within_the_metric_budget():
    conv = probs([0, 1, 2, 0]).copy()
    conv[3] = np.nan
    v = gate(probs([0, 1, 2, 0]), conv, [0, 1, 2, 0], max_drop=1.0)
    assert v.nonfinite_outputs == 3 and not v.passed and v.max_abs_diff is None


def test_near_ties_at_16_bit_resolution_are_left_out_of_the_agreement():
    # Rows 0-1 are clear; in rows 2-3 the two best scores differ by 0.0005,
    # below float16's spacing at 1.0 (2**-10 ~ 0.00098): a flip there is rounding.
    ref = np.array([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1], [0.4, 0.4005, 0.1995], [0.4005, 0.4, 0.1995]], np.float32)
    conv = np.array([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1], [0.4005, 0.4, 0.1995], [0.4, 0.4005, 0.1995]], np.float32)
    split = Split((np.zeros((4, 2), np.float32),), np.array([0, 1, 1, 0]))
    v = compare([ref], [conv], split, SOFTMAX, "accuracy", "npz", resolution=2.0**-10)
    assert v.agreement == 1.0 and v.agreement_rows == 2
    # The float32 model is right on all four, the converted one not on the
    # ties: rounding, so nothing counts as harmed either.
    assert (v.harmed, v.fixed, v.kept_correct, v.kept_correct_rows) == (0, 0, 1.0, 2)
    assert check_agreement(v, 0.95).message == (
        "kept 100.00% of the 2 rows the float32 model got right (0 harmed, 0 fixed; 2 near-ties left out) >= min 95.00%"
    )
    # without the resolution, both ties count as disagreements, and as harm
    untied = compare([ref], [conv], split, SOFTMAX, "accuracy", "npz")
    assert untied.agreement == 0.5
    assert (untied.harmed, untied.fixed, untied.kept_correct, untied.kept_correct_rows) == (2, 0, 0.5, 4)
    # all rows tied: no agreement to judge
    tied = compare(
        [ref[2:]],
        [conv[2:]],
        Split((np.zeros((2, 2), np.float32),), None),
        SOFTMAX,
        "accuracy",
        "generated",
        resolution=2.0**-10,
    )
    assert tied.agreement is None and tied.agreement_rows == 0


# --- the agreement check: harm with labels, agreement without ----------------

SIGMOID2 = Task("sigmoid", TensorSpec("p", (None, 2), "float32"))


def shifted(labels, by):
    """Wrong predictions: the class `by` (1 or 2) after the label."""
    return (np.asarray(labels) + by) % 3


def test_a_conversion_that_only_fixes_predictions_passes():
    # 100 rows. The float32 model is right on rows 0-62 (0.63); the converted
    # one on rows 0-84 (0.85): 22 fixed, none harmed. Where both are wrong they
    # agree on rows 85-91 and pick different wrong classes on rows 92-99, so
    # predictions agree on 63 + 7 = 70 rows.
    labels = np.arange(100) % 3
    ref = np.r_[labels[:63], shifted(labels[63:], 1)]
    conv = np.r_[labels[:85], shifted(labels[85:92], 1), shifted(labels[92:], 2)]
    v = gate(probs(ref), probs(conv), labels, max_drop=0.01)
    assert (v.reference, v.converted) == (0.63, 0.85) and v.passed
    assert v.agreement == 0.70 and v.agreement_rows == 100  # still reported
    assert (v.harmed, v.fixed, v.kept_correct, v.kept_correct_rows) == (0, 22, 1.0, 63)
    check = v.agreement_check
    assert check.name == "agreement" and check.passed
    assert check.message == "kept 100.00% of the 63 rows the float32 model got right (0 harmed, 22 fixed) >= min 95.00%"
    # The rule before labels counted: agreement 0.70 < 0.95 failed this conversion.
    old_format = {
        k: val for k, val in v.__dict__.items() if k not in ("harmed", "fixed", "kept_correct", "kept_correct_rows")
    }
    assert not check_agreement(Validation.from_json(old_format), 0.95).passed


@pytest.mark.parametrize("min_agreement,passed", [(0.95, False), (0.90, True)])
def test_harming_6_of_60_right_rows_keeps_90_percent(min_agreement, passed):
    # The float32 model is right on rows 0-59 of 100; the converted model
    # breaks rows 54-59 (6 harmed) and fixes rows 60-69 (10 fixed):
    # kept 54 / 60 = 0.90, although accuracy rose from 0.60 to 0.64.
    labels = np.arange(100) % 3
    ref = np.r_[labels[:60], shifted(labels[60:], 1)]
    conv = np.r_[labels[:54], shifted(labels[54:60], 1), labels[60:70], shifted(labels[70:], 1)]
    v = gate(probs(ref), probs(conv), labels, max_drop=0.01, min_agreement=min_agreement)
    assert (v.reference, v.converted) == (0.60, 0.64)
    assert (v.harmed, v.fixed, v.kept_correct, v.kept_correct_rows) == (6, 10, 0.9, 60)
    assert v.agreement == 0.84  # 16 rows changed
    check = v.agreement_check
    assert check.passed is passed
    sign = ">=" if passed else "<"
    assert check.message == (
        f"kept 90.00% of the 60 rows the float32 model got right (6 harmed, 10 fixed) {sign} min {min_agreement:.2%}"
    )
    assert check.values.to_json() == {
        "kept_correct": 0.9,
        "min_agreement": min_agreement,
        "rows": 60,
        "harmed": 6,
        "fixed": 10,
        "agreement": 0.84,
    }


def test_without_labels_the_check_is_agreement_with_the_original():
    # Generated inputs: the converted model changes 1 prediction of 20.
    ref = np.arange(20) % 3
    conv = np.r_[ref[:19], shifted(ref[19:], 1)]
    v = gate(probs(ref), probs(conv), None, max_drop=0.01)
    assert v.metric is None and v.agreement == 0.95
    assert (v.harmed, v.fixed, v.kept_correct, v.kept_correct_rows) == (None, None, None, None)
    assert v.agreement_check.passed
    assert v.agreement_check.message == "predictions agree on 95.00% of 20 rows >= min 95.00%"
    assert not check_agreement(Validation.from_json(v.__dict__), 0.951).passed


def test_a_regression_model_has_no_agreement_check():
    labels = np.array([[1.0], [2.0]], np.float32)
    v = gate(labels, labels + 0.5, labels, max_drop=1.0, task=REGRESSION, metric="mse")
    assert v.agreement is None and v.harmed is None and v.agreement_check is None


def test_a_sigmoid_row_is_right_only_when_every_unit_is():
    labels = np.array([[1, 0], [1, 1], [0, 0], [0, 1]], np.float32)
    # float32: rows 0 and 2 right; rows 1 and 3 each have one unit wrong
    ref = np.array([[0.9, 0.1], [0.9, 0.2], [0.1, 0.1], [0.8, 0.9]], np.float32)
    # converted: row 0 loses a unit (harmed), row 1 gains one (fixed), row 3
    # swaps which unit is wrong (still wrong)
    conv = np.array([[0.9, 0.8], [0.9, 0.9], [0.1, 0.1], [0.2, 0.3]], np.float32)
    v = gate(ref, conv, labels, max_drop=0.0, task=SIGMOID2)
    # the metric counts units: 6 of 8 right before and after
    assert (v.reference, v.converted, v.drop) == (0.75, 0.75, 0.0) and v.passed
    assert v.agreement == 0.25  # only row 2 predicts the same on both units
    assert (v.harmed, v.fixed, v.kept_correct, v.kept_correct_rows) == (1, 1, 0.5, 2)
    # 2 right rows are fewer than the 20 at which min 95% allows one harmed: not judged, and said so
    assert v.agreement_check.passed and v.agreement_check.message.startswith(
        "not judged: the float32 model got only 2 of the 4 decisive rows right, fewer than 20"
    )
    # at a minimum of 100% any harm is judged, whatever the count
    judged = gate(ref, conv, labels, max_drop=0.0, task=SIGMOID2, min_agreement=1.0).agreement_check
    assert not judged.passed
    assert judged.message == "kept 50.00% of the 2 rows the float32 model got right (1 harmed, 1 fixed) < min 100.00%"


def test_no_row_right_in_float32_leaves_nothing_to_harm():
    labels = np.zeros(4, int)
    v = gate(probs([1, 1, 2, 2]), probs([0, 1, 0, 2]), labels, max_drop=1.0)
    assert (v.harmed, v.fixed, v.kept_correct, v.kept_correct_rows) == (0, 2, None, 0)
    assert v.agreement_check.passed
    assert v.agreement_check.message == (
        "not judged: the float32 model got none of the 4 decisive rows right, so none can be harmed (2 fixed)"
    )
