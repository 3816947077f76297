"""The accuracy gate and its numbers, against hand-computed values."""

import numpy as np
import pytest

from mpconvert.data import Split, Task
from mpconvert.gate import check_accuracy
from mpconvert.signature import TensorSpec
from mpconvert.validate import compare

SOFTMAX = Task("softmax", TensorSpec("p", (None, 3), "float32"))
REGRESSION = Task("regression", TensorSpec("v", (None, 1), "float32"))


def probs(classes):
    return np.eye(3, dtype=np.float32)[classes]


def gate(reference, converted, labels, max_drop, task=SOFTMAX, metric="accuracy"):
    """The measurements, and the gate's accuracy verdict on them as `passed`."""
    split = Split((np.zeros((len(labels), 2), np.float32),), np.asarray(labels))
    v = compare([reference], [converted], split, task, metric, "npz")
    return Judged(v, check_accuracy(v.as_dict(), max_drop).passed)


class Judged:
    def __init__(self, validation, passed):
        self.__dict__.update(validation.as_dict())
        self.passed = passed


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
    # without the resolution, both ties count as disagreements
    assert compare([ref], [conv], split, SOFTMAX, "accuracy", "npz").agreement == 0.5
    # all rows tied: no agreement to judge
    tied = compare([ref[2:]], [conv[2:]], Split((np.zeros((2, 2), np.float32),), None), SOFTMAX, "accuracy", "generated", resolution=2.0**-10)
    assert tied.agreement is None and tied.agreement_rows == 0
