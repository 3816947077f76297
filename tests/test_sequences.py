"""Sequence outputs (batch, time, classes): token-id labels, per-token metrics, padding left out (issue 37, point 2).

The per-token figures are checked against a hand-written 2x4 example; the
label checks on arrays; the masked fine-tuning loss against Keras's own
cross-entropy over the real tokens; and the command line on the tagger
(both policies: ids with garbage at padding, one-hot rows), on the
keras-hub GPT-2 with a logits head, and refusing labels of a wrong shape
for the logits and the softmax head alike.
"""

import json
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest
import sequence_models as sm
from conftest import invoke, refused

from mpconvert.data import tokens
from mpconvert.data.signature import TensorSpec
from mpconvert.data.tasks import IGNORED, Task, TaskKind, TokenPadding, check_labels, padding_of
from mpconvert.options.validate import Metric
from mpconvert.report.measure import choose_metric, compare_output
from mpconvert.report.sections import OutputValidation, Validation
from mpconvert.system.errors import MpconvertError

X = IGNORED
# 2 rows of 4 positions, 3 classes; the last positions of each row are padding (their scores are garbage).
PROBABILITIES = np.array(
    [
        [[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.5, 0.4, 0.1], [0.0, 0.0, 1.0]],
        [[0.2, 0.5, 0.3], [0.6, 0.3, 0.1], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]],
    ]
)
LABELS = np.array([[0, 2, 1, X], [1, 1, X, X]])
# Right: (0,0), (0,1), (1,0); wrong: (0,2) and (1,1). The label's probabilities: .7 .6 .4 .5 .3.
CROSS_ENTROPY = -(math.log(0.7) + math.log(0.6) + math.log(0.4) + math.log(0.5) + math.log(0.3)) / 5
SEQUENCE = TensorSpec("tags", (None, None, 3), "float32")


def test_token_accuracy_and_cross_entropy_leave_padding_out_by_hand():
    assert tokens.accuracy(PROBABILITIES, LABELS) == pytest.approx(3 / 5)
    assert tokens.cross_entropy(PROBABILITIES, LABELS, logits=False) == pytest.approx(CROSS_ENTROPY)
    assert CROSS_ENTROPY == pytest.approx(0.736182, abs=1e-6)
    # Logits: the log-probabilities, shifted by any constant per position, give the same figures.
    logits = np.log(np.clip(PROBABILITIES, 1e-3, 1)) + np.arange(8).reshape(2, 4, 1)
    assert tokens.accuracy(logits, LABELS) == pytest.approx(3 / 5)
    assert tokens.cross_entropy(logits, LABELS, logits=True) == pytest.approx(CROSS_ENTROPY)
    assert tokens.perplexity(CROSS_ENTROPY) == pytest.approx(math.exp(0.736182), rel=1e-6)
    # Without the padding left out, the garbage would count: (0,3) and (1,2) wrong against label 0/1.
    everything = np.where(LABELS == X, 1, LABELS)
    assert tokens.accuracy(PROBABILITIES, everything) == pytest.approx(4 / 8)


def test_agreement_and_harm_count_tokens_not_rows():
    converted = PROBABILITIES.copy()
    converted[0, 2] = [0.3, 0.6, 0.1]  # fixed: now label 1
    converted[1, 0] = [0.6, 0.3, 0.1]  # harmed: was label 1
    converted[0, 3] = [1.0, 0.0, 0.0]  # padding: changes nothing
    found = compare_output(PROBABILITIES, converted, LABELS, Task(TaskKind.SOFTMAX, SEQUENCE), "token_accuracy")
    assert (found.agreement_rows, found.agreed, found.kept_correct_rows, found.harmed, found.fixed) == (5, 3, 3, 1, 1)
    assert found.agreement == pytest.approx(3 / 5) and found.kept_correct == pytest.approx(2 / 3)
    assert (found.reference, found.converted) == (pytest.approx(3 / 5), pytest.approx(3 / 5))
    assert found.tokens.scored == 5 and found.tokens.padding == 3
    assert found.tokens.reference_cross_entropy == pytest.approx(CROSS_ENTROPY)
    assert found.tokens.reference_perplexity == pytest.approx(math.exp(CROSS_ENTROPY))
    # Without labels, the padding input's positions are what agreement counts: 5 tokens, 3 agree.
    mask = LABELS != X
    unlabelled = compare_output(PROBABILITIES, converted, None, Task(TaskKind.SOFTMAX, SEQUENCE), "accuracy", 0, mask)
    assert (unlabelled.agreement_rows, unlabelled.agreed, unlabelled.tokens.scored) == (5, 3, 5)
    # The section reads back as written, perplexity derived again from the cross-entropy.
    stored = json.loads(json.dumps(Validation.of([found], data="arrays", rows=2).to_json()))
    assert stored["tokens"]["scored"] == 5 and stored["metric"] == "token_accuracy"
    stored["tokens"]["reference_perplexity"] = 99.0
    again = Validation.from_json(stored).derived(["tags"])
    assert again.tokens.reference_perplexity == pytest.approx(math.exp(CROSS_ENTROPY))
    assert OutputValidation.from_json(found.to_json()) == found


def test_the_gate_says_tokens_and_a_report_with_more_tokens_than_rows_is_consistent():
    from mpconvert.report.consistency import _counts
    from mpconvert.report.gate import check_agreement

    converted = PROBABILITIES.copy()
    converted[1, 0] = [0.6, 0.3, 0.1]
    found = compare_output(PROBABILITIES, converted, LABELS, Task(TaskKind.SOFTMAX, SEQUENCE), "token_accuracy")
    check = check_agreement(found, 0.5)
    assert check.passed and check.message.startswith("kept 66.67% of the 3 tokens the float32 model got right")
    # 5 decisive tokens in 2 rows is no contradiction; 6 of 5 scored tokens is.
    assert _counts(found.to_json(), "validation") == []
    assert [c.field for c in _counts({**found.to_json(), "agreement_rows": 6}, "validation")][:1] == [
        "validation.agreement_rows"
    ]


PADDED = TokenPadding(0, "tokens", "input 'tokens'")


def test_token_ids_and_one_hot_rows_are_read_the_same_and_padding_is_not_read():
    task = Task(TaskKind.SOFTMAX, SEQUENCE, padding=PADDED)
    positions = LABELS != X
    garbage = np.where(positions, LABELS, np.array([[0, 0, 0, 99], [0, 0, -100, 7]]))
    ids = check_labels("data", "y", garbage, task, positions)
    np.testing.assert_array_equal(ids, LABELS)
    rng = np.random.default_rng(0)
    one_hot = np.eye(3)[np.where(positions, LABELS, 0)]
    one_hot[~positions] = rng.integers(0, 5, size=(3, 3))  # not one-hot at all: padding is not read
    np.testing.assert_array_equal(check_labels("data", "y", one_hot, task, positions), LABELS)
    # Without a padding input an all-zero one-hot row is no token.
    one_hot[~positions] = 0
    np.testing.assert_array_equal(check_labels("data", "y", one_hot, Task(TaskKind.SOFTMAX, SEQUENCE)), LABELS)


@pytest.mark.parametrize(
    "labels,needle",
    [
        (np.zeros((2, 4, 2)), "'y' has shape (2, 4, 2), expected (n, ?) token ids in [0, 3) or (n, ?, 3) one-hot rows"),
        (np.zeros(2), "'y' has shape (2,), expected (n, ?) token ids in [0, 3) or (n, ?, 3) one-hot rows"),
        (np.full((2, 4), 3), "'y' has labels from 3 to 3, but output 'tags' has 3 classes (0 to 2)"),
        (np.full((2, 4, 3), 0.5), "'y' has one column per class but its rows are not one-hot"),
    ],
)
def test_wrong_token_labels_are_refused_naming_the_shapes_a_sequence_output_takes(labels, needle):
    with pytest.raises(MpconvertError) as found:
        check_labels("data", "y", labels, Task(TaskKind.SOFTMAX, SEQUENCE))
    assert needle in str(found.value)


def test_every_position_padding_is_refused():
    with pytest.raises(MpconvertError, match="every position is padding by input 'tokens'"):
        check_labels("data", "y", LABELS, Task(TaskKind.SOFTMAX, SEQUENCE, padding=PADDED), np.zeros((2, 4), bool))


def test_a_head_without_activation_takes_ids_as_logits_and_targets_as_regression():
    logits_head = Task(TaskKind.REGRESSION, TensorSpec("lm_logits", (None, None, 3), "float32"))
    ids = check_labels("data", "y", LABELS.clip(0), logits_head)
    scored = logits_head.scored_by(ids)
    assert (scored.kind, scored.logits, scored.tokens) == (TaskKind.SOFTMAX, True, True)
    one_hot = check_labels("data", "y", np.eye(3)[LABELS.clip(0)], logits_head)
    np.testing.assert_array_equal(one_hot, ids)
    targets = check_labels("data", "y", np.full((2, 7, 3), 0.5), logits_head)  # any length on the unknown axis
    assert targets.dtype == np.float32 and targets.shape == (2, 7, 3)
    assert logits_head.scored_by(targets).kind is TaskKind.REGRESSION
    with pytest.raises(MpconvertError) as found:
        check_labels("data", "y", np.zeros((2, 7, 4)), logits_head)
    assert (
        "expected (n, ?) token ids in [0, 3) or (n, ?, 3) one-hot rows, or targets (n, ?, 3) float32 "
        "for sequence output 'lm_logits'" in str(found.value)
    )


def test_the_padding_input_is_found_by_name_or_by_a_mask_zero_embedding():
    out = TensorSpec("lm", (None, None, 9), "float32")
    ids, mask = TensorSpec("token_ids", (None, None), "int32"), TensorSpec("padding_mask", (None, None), "int32")
    assert padding_of(out, (mask, ids)) == TokenPadding(0, "padding_mask", "input 'padding_mask' (0 marks padding)")
    # A dict input's key counts as its name.
    renamed = TensorSpec("pm", (None, None), "int32")
    assert padding_of(out, (renamed, ids), ("padding_mask", "token_ids")).input == 0
    found = padding_of(out, (ids,), zero_masked={0: "embed"})
    assert found.input == 0 and "Embedding 'embed' has mask_zero" in found.source
    assert padding_of(out, (ids,)) is None
    assert padding_of(TensorSpec("cls", (None, 9), "float32"), (mask, ids)) is None  # not a sequence output
    assert padding_of(out, (TensorSpec("padding_mask", (None, 4, 4), "int32"),)) is None  # not (n, time)


def test_a_sequence_output_is_scored_by_token_accuracy_unless_told_cross_entropy():
    task = Task(TaskKind.SOFTMAX, SEQUENCE)
    assert choose_metric(None, task, LABELS) is Metric.TOKEN_ACCURACY
    assert choose_metric("accuracy", task, LABELS) is Metric.TOKEN_ACCURACY
    assert choose_metric("cross_entropy", task, LABELS) is Metric.CROSS_ENTROPY
    with pytest.raises(MpconvertError, match="--metric mse does not score sequence output 'tags'"):
        choose_metric("mse", task, LABELS)
    flat = Task(TaskKind.SOFTMAX, TensorSpec("cls", (None, 3), "float32"))
    with pytest.raises(MpconvertError, match="--metric cross_entropy needs a sequence output"):
        choose_metric("cross_entropy", flat, np.array([0, 1]))


# --- with TensorFlow ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    import keras

    root = tmp_path_factory.mktemp("sequences")
    sm.tagger(keras).save(root / "tagger.keras")
    x, y = sm.tagger_data(60, 3)
    x_train, y_train = sm.tagger_data(100, 4)
    padding = x == 0
    rng = np.random.default_rng(5)
    garbage = np.where(padding, rng.integers(-100, 100, size=y.shape), y)
    np.savez(root / "garbage.npz", x=x, y=garbage, x_train=x_train, y_train=y_train)
    one_hot = np.eye(sm.TAGGER_TAGS)[np.where(padding, rng.integers(0, sm.TAGGER_TAGS, size=y.shape), y)]
    np.savez(root / "one_hot.npz", x=x, y=one_hot, x_train=x_train, y_train=y_train)
    np.savez(root / "clean.npz", x=x, y=y)
    sm.gpt2(keras, "logits").save(root / "gpt2_logits.keras")
    sm.gpt2(keras, "softmax").save(root / "gpt2_softmax.keras")
    np.savez(root / "gpt2.npz", **sm.gpt2_data(12, 1), **sm.gpt2_data(24, 2, "_train"))
    return root


def _real_token_figures(model_path, inputs, y, mask, from_logits):
    """Token accuracy and cross-entropy of the float32 model over the real tokens, by Keras's own loss."""
    import keras
    import keras_hub  # noqa: F401  (registers GPT-2's layers for loading)

    model = keras.models.load_model(model_path, compile=False)
    scores = np.asarray(model.predict(inputs, verbose=0))
    accuracy = float((scores.argmax(-1) == y)[mask].mean())
    losses = keras.losses.sparse_categorical_crossentropy(y[mask], scores[mask], from_logits=from_logits)
    return accuracy, float(np.mean(keras.ops.convert_to_numpy(losses)))


def test_the_masked_fine_tuning_loss_is_keras_cross_entropy_over_the_real_tokens(zoo):
    import keras

    from mpconvert.keras.finetune import Trainer, token_weights, training_labels
    from mpconvert.keras.frameworks import KERAS3

    model = keras.models.load_model(zoo / "tagger.keras", compile=False)
    x, y = sm.tagger_data(8, 9)
    mask = x != 0
    task = Task(TaskKind.SOFTMAX, TensorSpec("tags", (None, sm.TAGGER_LENGTH, sm.TAGGER_TAGS), "float32"))
    labels = check_labels("data", "y", y, task, mask)
    name = "sparse_categorical_crossentropy"
    trained = training_labels(task, labels, name)
    weights = token_weights(task, labels)
    assert trained.min() >= 0 and np.array_equal(weights, mask.astype(np.float32))
    expected = keras.losses.sparse_categorical_crossentropy(y[mask], model.predict(x, verbose=0)[mask])
    trainer = Trainer(KERAS3, model, KERAS3.loss_function(name), 0.0, loss_scaling=False)
    loss, applied = trainer.step([x], [trained], [weights])
    assert applied and loss == pytest.approx(float(np.mean(keras.ops.convert_to_numpy(expected))), rel=1e-5)
    # A batch of nothing but padding adds no loss (and no NaN).
    loss, applied = trainer.step([x], [trained], [np.zeros_like(weights)])
    assert loss == 0.0 and applied


@pytest.mark.parametrize(
    "policy,data", [("mixed_float16", "garbage.npz"), ("mixed_bfloat16", "one_hot.npz")], ids=["f16-ids", "bf16-onehot"]
)
def test_the_tagger_is_gated_per_token_with_padding_left_out(zoo, tmp_path, policy, data):
    out = tmp_path / "out"
    args = ["--policy", policy, "--data", zoo / data, "--out", out, "--finetune-steps", "10", "--learning-rate", "1e-3"]
    result = invoke(zoo / "tagger.keras", *args, "--export", "savedmodel", "--no-speed", "--pad-multiple", "0")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    v = report["validation"]
    clean = np.load(zoo / "clean.npz")
    mask = clean["x"] != 0
    accuracy, cross_entropy = _real_token_figures(zoo / "tagger.keras", clean["x"], clean["y"], mask, False)
    # Whatever the padded positions held (garbage ids, random one-hot rows), the float32 figures are the
    # clean labels' over the real tokens.
    assert v["metric"] == "token_accuracy" and v["reference"] == pytest.approx(accuracy, abs=1e-9)
    assert 0.85 <= accuracy < 1.0 and v["drop"] <= 0.01
    assert v["tokens"]["scored"] == int(mask.sum()) and v["tokens"]["padding"] == int((~mask).sum())
    assert v["tokens"]["reference_cross_entropy"] == pytest.approx(cross_entropy, rel=1e-4)
    assert v["tokens"]["padding_from"].startswith("input 'tokens' (token id 0")
    assert v["kept_correct_rows"] <= v["agreement_rows"] <= mask.sum() and v["agreement_rows"] > v["rows"]
    assert report["finetune"]["metric"] == "token_accuracy" and report["finetune"]["steps"] == 10
    assert report["finetune"]["metric_before"] == pytest.approx(v["reference"], abs=0.02)
    assert report["passed"]
    checks = {c["name"]: c for c in report["gate"]["checks"]}
    assert checks["accuracy gate"]["message"].startswith(f"token_accuracy {accuracy:.4f} -> ")
    assert " tokens the float32 model got right" in checks["agreement"]["message"]
    line = f"{mask.sum()} tokens ({(~mask).sum()} padding left out"
    assert line in result.output and line in (out / "report.html").read_text()


def test_the_gpt2_logits_head_is_scored_and_fine_tuned_per_token(zoo, tmp_path):
    out = tmp_path / "out"
    args = ["--import", "keras_hub", "--policy", "mixed_bfloat16", "--data", zoo / "gpt2.npz", "--out", out]
    result = invoke(zoo / "gpt2_logits.keras", *args, "--finetune-steps", "2", "--export", "savedmodel", "--no-speed")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    v = report["validation"]
    data = np.load(zoo / "gpt2.npz")
    mask = data["padding_mask"] != 0
    inputs = {"token_ids": data["token_ids"], "padding_mask": data["padding_mask"]}
    accuracy, cross_entropy = _real_token_figures(zoo / "gpt2_logits.keras", inputs, data["y"], mask, True)
    assert v["metric"] == "token_accuracy" and v["reference"] == pytest.approx(accuracy, abs=1e-9)
    tokens_found = v["tokens"]
    assert tokens_found["padding_from"] == "input 'padding_mask' (0 marks padding)"
    assert (tokens_found["scored"], tokens_found["padding"]) == (int(mask.sum()), int((~mask).sum()))
    # Random weights: about log(1000) = 6.91 nats per token, as Keras's loss from logits gives it.
    assert tokens_found["reference_cross_entropy"] == pytest.approx(cross_entropy, rel=1e-4)
    assert 6.0 < cross_entropy < 8.0
    assert report["finetune"]["loss_function"] == (
        "sparse_categorical_crossentropy (from logits) (default for a sequence logits output)"
    )
    assert report["finetune"]["healthy"] and report["finetune"]["loss"]["first"] == pytest.approx(
        cross_entropy, abs=0.3
    )


@pytest.mark.parametrize("head", ["logits", "softmax"])
def test_labels_of_a_wrong_shape_are_refused_naming_what_a_sequence_output_takes(zoo, tmp_path, head):
    data = np.load(zoo / "gpt2.npz")
    wrong = {"token_ids": data["token_ids"], "padding_mask": data["padding_mask"], "y": data["y"][:, 0]}
    np.savez(tmp_path / "wrong.npz", **wrong)
    out = tmp_path / "out"
    args = ["--import", "keras_hub", "--policy", "mixed_bfloat16", "--data", tmp_path / "wrong.npz", "--out", out]
    result = invoke(zoo / f"gpt2_{head}.keras", *args)
    refused(
        result,
        out,
        "'y' has shape (12,), expected (n, ?) token ids in [0, 1000) or (n, ?, 1000) one-hot rows",
        f"for sequence output 'lm_{head}'",
    )


def test_labels_that_do_not_line_up_with_the_output_are_refused_when_it_has_run():
    task = Task(TaskKind.SOFTMAX, SEQUENCE)
    with pytest.raises(MpconvertError, match=r"have shape \(2, 3\), but the model gives \(2, 4, 3\)"):
        compare_output(PROBABILITIES, PROBABILITIES, LABELS[:, :3], task, "token_accuracy")
    targets = Task(TaskKind.SIGMOID, SEQUENCE)  # 0/1 per unit, on an unknown time axis
    with pytest.raises(MpconvertError, match=r"output 'tags' have shape \(2, 5, 3\), but the model gives"):
        compare_output(PROBABILITIES, PROBABILITIES, np.zeros((2, 5, 3), np.float32), targets, "accuracy")
