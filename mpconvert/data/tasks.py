"""What a model output means (its task), and what its inputs and labels must look like to be used.

A task decides an output's metric and the labels it takes; the checks turn
an array a user gave into one the model and the metric can use (float32
inputs, class ids, targets shaped like the output), or refuse it with the
key and the expected shape. Shared by every source of rows (data.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from mpconvert.data.signature import TensorSpec
from mpconvert.system.errors import MpconvertError


class TaskKind(StrEnum):
    """What one model output computes, by its final activation."""

    SOFTMAX = "softmax"  # one class per row (softmax or log_softmax)
    SIGMOID = "sigmoid"  # a unit per label, or per class (see Task.scored_by)
    REGRESSION = "regression"  # anything else: scored by mse


@dataclass(frozen=True)
class Task:
    """What one model output means, which decides its metric and labels."""

    kind: TaskKind
    output: TensorSpec
    # The scores are logits (log_softmax, or a head without activation scored as classes): softmax makes
    # them probabilities. False for a softmax output, whose scores are probabilities already.
    logits: bool = False
    # A sequence output's padding: the input that marks which positions are not tokens (None: every one is).
    padding: TokenPadding | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", TaskKind(self.kind))  # a plain string from a caller

    @property
    def classes(self) -> int | None:
        return self.output.shape[-1] if self.kind is TaskKind.SOFTMAX else None

    @property
    def sequence(self) -> bool:
        """Scores per position ((batch, time, classes), any rank, the class axis last): scored per token."""
        return len(self.output.shape) >= 3

    @property
    def tokens(self) -> bool:
        """A sequence output scored by classes: one class id per position (token accuracy, cross-entropy)."""
        return self.sequence and self.kind is TaskKind.SOFTMAX

    def scored_by(self, labels: np.ndarray | None) -> Task:
        """The task as its checked labels score it: a sigmoid output is not always a binary classifier.

        Class ids (n,) for a Dense(k > 1, "sigmoid") output are scored like a
        softmax (argmax accuracy); targets in [0, 1] that are not all 0/1
        (reconstructions, probabilities) like a regression (mse, no
        agreement); 0/1 labels shaped like the output keep the per-unit rule.
        """
        if labels is not None and self.sequence and self.kind is TaskKind.REGRESSION and token_ids(labels, self):
            # A sequence head without activation labelled with token ids is a language model's logits.
            return replace(self, kind=TaskKind.SOFTMAX, logits=True)
        if self.kind is not TaskKind.SIGMOID or labels is None:
            return self
        if labels.ndim == 1 and sigmoid_units(self):
            return Task(TaskKind.SOFTMAX, self.output)
        if not ((labels == 0) | (labels == 1)).all():
            return Task(TaskKind.REGRESSION, self.output)
        return self


@dataclass(frozen=True)
class TokenPadding:
    """The model input that marks a sequence output's padding: a position where it is 0 is no token.

    Read from the model, never guessed from the labels: an input named
    `padding_mask` (keras-hub's backbones) or `attention_mask` (1 for a
    token, 0 for padding), else a token-id input that an
    `Embedding(mask_zero=True)` reads directly (id 0 is padding, as Keras
    masks it). Its shape must be the labels' (the output's minus the class
    axis) for it to apply.
    """

    input: int  # index in the signature's inputs
    name: str  # that input's name
    source: str  # why it marks padding, as the report says it

    def positions(self, inputs: tuple[np.ndarray, ...] | list[np.ndarray]) -> np.ndarray:
        """True where a token is (a caller applies it only where its shape is the labels')."""
        return np.asarray(inputs[self.input]) != 0


PADDING_MASK_NAMES = ("padding_mask", "attention_mask")
# What a position that is no token holds in checked token ids: the padding the model's own mask marks
# (and an all-zero one-hot row). Every metric and loss leaves it out.
IGNORED = -1


def padding_of(output: TensorSpec, inputs: tuple[TensorSpec, ...], keys: tuple[str, ...] = (), zero_masked=None):
    """The TokenPadding of a sequence `output`, or None: a mask input by name, else `zero_masked`
    ({input index: the Embedding(mask_zero=True) layer that reads it})."""
    rank = len(output.shape) - 1
    if rank < 2:
        return None
    names = [(key or spec.name, spec) for key, spec in zip(keys or ("",) * len(inputs), inputs)]
    for i, (key, spec) in enumerate(names):
        if (spec.name in PADDING_MASK_NAMES or key in PADDING_MASK_NAMES) and len(spec.shape) == rank:
            return TokenPadding(i, spec.name, f"input {spec.name!r} (0 marks padding)")
    for i, layer in (zero_masked or {}).items():
        spec = inputs[i]
        if len(spec.shape) == rank and not spec.is_float and not spec.is_string:
            return TokenPadding(i, spec.name, f"input {spec.name!r} (token id 0: Embedding {layer!r} has mask_zero)")
    return None


def token_ids(labels: np.ndarray, task: Task) -> bool:
    """Whether checked labels are token ids for a sequence output: one integer per position."""
    return labels.ndim == len(task.output.shape) - 1 and np.issubdtype(labels.dtype, np.integer)


def check_input(where: str, key: str, array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    expected = f"expected {spec.describe()} for input {spec.name!r}"
    if array.size == 0 or array.ndim == 0:
        raise MpconvertError(f"{where}: {key!r} is empty", hint=f"{expected}, with at least one row")
    if array.ndim != len(spec.shape) or any(d is not None and a != d for a, d in zip(array.shape[1:], spec.shape[1:])):
        raise MpconvertError(
            f"{where}: {key!r} has shape {array.shape}, {expected}",
            hint="reshape the array to the model's input shape",
        )
    if spec.is_float:
        if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
            raise MpconvertError(
                f"{where}: {key!r} has dtype {array.dtype}, {expected}",
                hint="store numbers, e.g. x.astype('float32')",
            )
        array = array.astype(np.float32)
        if not np.isfinite(array).all():
            bad = int(np.count_nonzero(~np.isfinite(array)))
            raise MpconvertError(
                f"{where}: {key!r} contains {bad} NaN or infinite value(s)",
                hint="clean or impute the data; validation needs finite inputs",
            )
        return array
    if spec.is_string:
        return string_array(where, key, array, expected)
    if not np.issubdtype(array.dtype, np.integer):
        raise MpconvertError(
            f"{where}: {key!r} has dtype {array.dtype}, {expected}",
            hint="integer inputs (token ids) must be stored as integers",
        )
    return array.astype(spec.dtype)


def string_array(where: str, key: str, array: np.ndarray, expected: str) -> np.ndarray:
    """Text for a string input as fixed-width unicode ('<U..'), the one form strings travel in here.

    A unicode array is what every runtime takes (Keras and TensorFlow encode
    it as UTF-8, ONNX Runtime reads it as its string type) and what an .npz
    stores without pickle; bytes ('S..') are decoded as UTF-8, and an object
    array of str or bytes (a tf.data pipeline or a data function yields those)
    becomes unicode the same way.
    """
    if array.dtype.kind == "U":
        return array
    if array.dtype.kind in "SO":
        try:
            flat = [v.decode("utf-8") if isinstance(v, bytes) else v for v in array.ravel().tolist()]
        except UnicodeDecodeError as exc:
            raise MpconvertError(
                f"{where}: {key!r} holds bytes that are not UTF-8 ({exc.reason} at byte {exc.start})",
                hint="store the text as unicode, e.g. np.array(list_of_str), or decode it as UTF-8 first",
            ) from None
        if all(isinstance(v, str) for v in flat):
            # np.array of an empty list would be float64: keep the dtype unicode.
            return np.array(flat, dtype=str).reshape(array.shape)
    raise MpconvertError(
        f"{where}: {key!r} has dtype {array.dtype}, {expected}",
        hint="store text as fixed-width unicode, e.g. np.array(list_of_str) (dtype '<U..'), not numbers",
    )


def check_labels(
    where: str, key: str, labels: np.ndarray, task: Task, positions: np.ndarray | None = None
) -> np.ndarray:
    """`labels` in the form the metric reads, or refused naming the key and the shapes the output takes.

    `positions` (a sequence output with a padding input: True where a token
    is) marks the positions whose labels are not read: they become IGNORED,
    whatever they held.
    """
    if labels.size == 0 or labels.ndim == 0:
        raise MpconvertError(f"{where}: {key!r} is empty", hint="store one label per sample")
    if not (np.issubdtype(labels.dtype, np.number) or labels.dtype == np.bool_):
        raise MpconvertError(
            f"{where}: {key!r} has dtype {labels.dtype}",
            hint="labels must be numbers (class ids, 0/1, or regression targets)",
        )
    if not np.isfinite(labels.astype(np.float64)).all():
        raise MpconvertError(f"{where}: {key!r} contains NaN or infinite values", hint="clean the labels")
    out = task.output
    if task.sequence and task.kind in (TaskKind.SOFTMAX, TaskKind.REGRESSION):
        ids = sequence_labels(where, key, labels, task, positions)
        if ids is not None:
            return ids
    elif task.kind is TaskKind.SOFTMAX:
        classes = task.classes
        if classes is None:
            raise MpconvertError(
                f"{where}: output {out.name!r} has no fixed number of classes ({out.describe()}), so class ids "
                "cannot be checked against it",
                hint="give the softmax output a fixed last dimension",
            )
        if labels.ndim == 2 and labels.shape[1] == classes and classes > 1:
            labels = one_hot_to_ids(where, key, labels)
        if labels.ndim == 2 and labels.shape[1] == 1:
            labels = labels[:, 0]
        if labels.ndim != 1:
            raise MpconvertError(
                f"{where}: {key!r} has shape {labels.shape}, expected (n,) class ids "
                f"in [0, {classes}) or (n, {classes}) one-hot rows",
                hint="store one integer class id per sample",
            )
        return class_ids(where, key, labels, classes, out)
    units = sigmoid_units(task)
    if units and labels.shape[1:] in ((), (1,)):
        # Class ids for a Dense(k > 1, "sigmoid") output: scored by argmax.
        return class_ids(where, key, labels.reshape(-1), units, out)
    row_shape = out.shape[1:]
    if not fits(labels.shape[1:], row_shape):
        # (n,) targets for an (n, 1) output are the same thing
        known = tuple(d for d in row_shape if d is not None)
        if len(known) < len(row_shape) or labels.size != len(labels) * int(np.prod(known)):
            raise MpconvertError(
                f"{where}: {key!r} has shape {labels.shape}, expected {out.describe()} like output {out.name!r}",
                hint="store one target row per sample, shaped like the model output",
            )
        labels = labels.reshape((len(labels), *known))
    labels = labels.astype(np.float32)
    if task.kind is TaskKind.SIGMOID and (labels.min() < 0.0 or labels.max() > 1.0):
        raise MpconvertError(
            f"{where}: {key!r} must hold 0/1 labels or targets in [0, 1] for sigmoid output {out.name!r} "
            f"(found values from {labels.min():g} to {labels.max():g})",
            hint="store binary labels as 0 and 1 (or class ids (n,) for a sigmoid output with several units)",
        )
    return labels


def fits(shape: tuple[int, ...], spec: tuple[int | None, ...]) -> bool:
    """`shape` is one of `spec`'s: the same rank, every known dimension equal (an unknown one takes any length)."""
    return len(shape) == len(spec) and all(d is None or a == d for a, d in zip(shape, spec))


def sequence_shapes(task: Task) -> str:
    """The labels a sequence output takes, as an error names them: "(n, ?) token ids in [0, 1000) or
    (n, ?, 1000) one-hot rows"."""
    dims = ["n"] + ["?" if d is None else str(d) for d in task.output.shape[1:]]
    classes = dims[-1]
    return f"({', '.join(dims[:-1])}) token ids in [0, {classes}) or ({', '.join(dims)}) one-hot rows"


def sequence_labels(
    where: str, key: str, labels: np.ndarray, task: Task, positions: np.ndarray | None
) -> np.ndarray | None:
    """Token ids (int64, IGNORED at padding) for a sequence output, from ids or one-hot rows.

    None for labels shaped like the output that are not one-hot, on an
    output without activation: targets, scored as a regression.
    """
    out = task.output
    classes = out.shape[-1]
    regression = task.kind is TaskKind.REGRESSION
    wrong = MpconvertError(
        f"{where}: {key!r} has shape {labels.shape}, expected {sequence_shapes(task)}"
        + (f", or targets {out.describe()}" if regression else "")
        + f" for sequence output {out.name!r}",
        hint="store one integer token id per position (the output's shape without its class axis)",
    )
    if classes is None or (regression and classes < 2):
        if regression:  # one unit per position, or no fixed number of classes: targets
            return None
        raise MpconvertError(
            f"{where}: output {out.name!r} has no fixed number of classes ({out.describe()}), so token ids "
            "cannot be checked against it",
            hint="give the softmax output a fixed last dimension",
        )
    # Padding positions are not read at all: whatever they hold (garbage, -100, repeated ids) is no label.
    skipped = np.zeros(labels.shape[: len(out.shape) - 1], dtype=bool)
    if positions is not None and positions.shape == skipped.shape:
        skipped = ~positions
    if fits(labels.shape[1:], out.shape[1:]):
        rows = labels[~skipped]
        sums = rows.sum(axis=-1)
        if not (np.isin(rows, (0, 1)).all() and np.isin(sums, (0, 1)).all() and sums.any()):
            if regression:
                return None
            raise MpconvertError(
                f"{where}: {key!r} has one column per class but its rows are not one-hot",
                hint=f"store {sequence_shapes(task)} (an all-zero row marks a position with no token)",
            )
        # An all-zero row is no token (Keras's categorical cross-entropy gives it no loss): not scored.
        skipped = skipped | (labels.sum(axis=-1) == 0)
        labels = labels.argmax(axis=-1)
    elif not fits(labels.shape[1:], out.shape[1:-1]):
        raise wrong
    if skipped.all():
        raise MpconvertError(
            f"{where}: {key!r} has no token to score for output {out.name!r}: every position is padding"
            + (f" by {task.padding.source}" if task.padding else " (all-zero one-hot rows)"),
            hint="check that the padding input marks tokens with 1 (or non-zero ids) and padding with 0",
        )
    class_ids(where, key, labels[~skipped], classes, out)
    return np.where(skipped, IGNORED, labels).astype(np.int64)


def sigmoid_units(task: Task) -> int | None:
    """k for a (None, k > 1) sigmoid output, which (n,) class ids can label; else None."""
    shape = task.output.shape
    if task.kind is not TaskKind.SIGMOID or len(shape) != 2 or not shape[-1] or shape[-1] < 2:
        return None
    return shape[-1]


def class_ids(where: str, key: str, labels: np.ndarray, classes: int, out: TensorSpec) -> np.ndarray:
    if not np.all(np.equal(np.mod(labels, 1), 0)):
        raise MpconvertError(f"{where}: {key!r} holds non-integer class ids", hint="store integer class ids")
    if labels.min() < 0 or labels.max() >= classes:
        raise MpconvertError(
            f"{where}: {key!r} has labels from {labels.min():g} to {labels.max():g}, "
            f"but output {out.name!r} has {classes} classes (0 to {classes - 1})",
            hint="check that the labels belong to this model",
        )
    return labels.astype(np.int64)


def one_hot_to_ids(where: str, key: str, labels: np.ndarray) -> np.ndarray:
    if not (np.isin(labels, (0, 1)).all() and np.all(labels.sum(axis=1) == 1)):
        raise MpconvertError(
            f"{where}: {key!r} has one column per class but its rows are not one-hot",
            hint="store class ids (n,) or exact one-hot rows",
        )
    return labels.argmax(axis=1)
