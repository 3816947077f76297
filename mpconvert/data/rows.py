"""Labelled data from an `.npz` file, checked against the model before use.

Format: `x` (or the input's own name) and `y` for a single-input,
single-output model; for several inputs one array per input, named after the
input; for several outputs one label array per output, `y_<output name>`, any
of which may be left out (an unlabelled output is compared with the original,
not scored). Optional `x_train`/`y_train` (or `<input>_train`,
`y_<output>_train`) are training splits for fine-tuning. A key that
misspells one of those is refused (a misspelt label key would otherwise
leave its output unscored without a word); any other key is not read, and
the report names it. Every problem is reported with the key and the
expected shape, before anything is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np

from mpconvert.data.keys import (
    TRAIN,
    did_you_mean,
    input_key_choices,
    input_keys,
    label_keys,
    pick_input_keys,
    pick_label_keys,
    unread_keys_of,
)
from mpconvert.data.npz import SMALLER_SPLIT, open_npz
from mpconvert.data.signature import Signature, generate_inputs
from mpconvert.data.tasks import Task, check_input, check_labels
from mpconvert.system.errors import MpconvertError
from mpconvert.system.urls import local_path
from mpconvert.system.usercode import import_module


class DataSource(StrEnum):
    """Where the validation (and training) rows came from: the report's `validation.data`."""

    NPZ = "npz"  # an .npz file
    CALLABLE = "callable"  # a module:function the user named
    ARRAYS = "arrays"  # arrays or tf.data Datasets given to the Python API
    GENERATED = "generated"  # no data: generated inputs, no labels


@dataclass(frozen=True)
class Split:
    inputs: tuple[np.ndarray, ...]
    # One entry per model output, in the signature's order; None where that
    # output has no labels (all None for generated inputs).
    labels: tuple[np.ndarray | None, ...]

    def __post_init__(self) -> None:
        if self.labels is None or isinstance(self.labels, np.ndarray):  # one output's labels, or none
            object.__setattr__(self, "labels", (self.labels,))

    @property
    def rows(self) -> int:
        return len(self.inputs[0])

    @property
    def labelled(self) -> bool:
        return any(y is not None for y in self.labels)


@dataclass(frozen=True)
class Overlap:
    """Validation rows that also appear in the training split (exact copies), and repeats within validation."""

    validation_rows: int
    train_rows: int
    in_train: int  # validation rows that are also training rows
    share: float  # in_train / validation_rows
    duplicates_within_validation: int

    @classmethod
    def of(cls, validation_rows: int, train_rows: int, in_train: int, duplicates_within_validation: int) -> Overlap:
        """The counts, with the share derived from them (as a re-check derives it again: `derived`)."""
        share = in_train / validation_rows if validation_rows else 0.0
        return cls(validation_rows, train_rows, in_train, share, duplicates_within_validation)

    def derived(self) -> Overlap:
        return Overlap.of(self.validation_rows, self.train_rows, self.in_train, self.duplicates_within_validation)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Overlap:
        found: dict[str, Any] = {f.name: stored.get(f.name) for f in dataclasses.fields(cls)}
        return cls(**found)


@dataclass(frozen=True)
class EvalData:
    validation: Split
    train: Split | None
    source: DataSource
    path: str | None = None
    overlap: Overlap | None = None  # validation rows also in training (see `overlap_of`); None without a train split
    unread_keys: tuple[str, ...] = ()  # the data file's keys no stage reads (see `unread_keys_of`)

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", DataSource(self.source))  # a plain string from a caller


def unlabelled(inputs: tuple[np.ndarray, ...] | list[np.ndarray], signature: Signature) -> Split:
    return Split(tuple(inputs), (None,) * len(signature.outputs))


def _row_digests(split: Split) -> list[bytes]:
    """One digest per row over every input's values: equal rows, equal digests."""
    flat = [np.ascontiguousarray(x).reshape(len(x), -1) for x in split.inputs]
    return [hashlib.blake2b(b"".join(x[i].tobytes() for x in flat), digest_size=16).digest() for i in range(split.rows)]


def overlap_of(validation: Split, train: Split | None) -> Overlap | None:
    """How many validation rows also appear in the training split (exact copies), and repeats within validation.

    Rows are compared on every input, by hashing their bytes. Fine-tuning on
    rows the gate then judges makes the accuracy check judge memory, not
    the conversion.
    """
    if train is None:
        return None
    seen = set(_row_digests(train))
    digests = _row_digests(validation)
    shared = sum(1 for d in digests if d in seen)
    return Overlap.of(
        validation_rows=validation.rows,
        train_rows=train.rows,
        in_train=shared,
        duplicates_within_validation=validation.rows - len(set(digests)),
    )


def resolve_data(spec: Any, signature: Signature, tasks: tuple[Task, ...] | Task) -> EvalData | None:
    """Labelled data in any form the CLI or the Python API accepts; None when none was given.

    A path (an .npz file), "module:function" (its result as below), or, from
    Python: (x, y) arrays, (train, validation) as a tuple of two such pairs
    (train may be None), a tf.data.Dataset of (x, y) for validation, or a
    (train, validation) tuple of Datasets. x is an array, or a list or dict
    (by input name) of arrays for a model with several inputs; y likewise a
    dict by output name (or a list in output order) for several outputs.
    """
    if spec is None:
        return None
    tasks = (tasks,) if isinstance(tasks, Task) else tasks
    if isinstance(spec, (str, Path)):
        local_path(spec, "--data")  # a URL is no module:function, and pathlib would make it a local "s3:" path
        if isinstance(spec, str) and is_callable_spec(spec):
            return load_callable(spec, signature, tasks)
        path = Path(spec)
        with open_npz(path) as arrays:  # lists the keys from the zip directory, reading no data
            unread = unread_keys_of(f"data file {path}", arrays, signature)
        return dataclasses.replace(load_npz(path, signature, tasks), unread_keys=unread)
    train, validation = _train_and_validation(spec)
    return _from_parts("data", train, validation, signature, tasks, DataSource.ARRAYS)


def _is_part(value: Any) -> bool:
    """A whole split: a Dataset, or an (x, y) pair (a tuple, where y itself is an array)."""
    return hasattr(value, "as_numpy_iterator") or (isinstance(value, tuple) and len(value) == 2)


def _train_and_validation(spec: Any) -> tuple[Any, Any]:
    if hasattr(spec, "as_numpy_iterator"):
        return None, spec
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        if _is_part(spec[1]) and (spec[0] is None or _is_part(spec[0])):
            return spec[0], spec[1]
        return None, tuple(spec)
    raise MpconvertError(
        f"data= got {type(spec).__name__}, which is not a form of labelled data",
        hint="pass a .npz path, (x, y) arrays, ((x_train, y_train), (x_val, y_val)), or a tf.data.Dataset of (x, y)",
    )


def load_npz(path: Path, signature: Signature, tasks: tuple[Task, ...] | Task) -> EvalData:
    """The model's arrays from an .npz; a member the model does not read is never read (nor judged: see unread_keys_of)."""
    tasks = (tasks,) if isinstance(tasks, Task) else tasks
    with open_npz(path) as arrays:
        try:
            return _eval_data(f"data file {path}", arrays, signature, tasks, DataSource.NPZ, str(path))
        except MemoryError:
            # Checking converts the arrays (astype, isfinite), which needs
            # memory beside them; reading itself is guarded per key.
            raise MpconvertError(f"ran out of memory while checking data file {path}", hint=SMALLER_SPLIT) from None


def _eval_data(
    where: str,
    arrays: Mapping[str, np.ndarray],
    signature: Signature,
    tasks: tuple[Task, ...],
    source: DataSource,
    origin: str | None,
) -> EvalData:
    validation = _split(where, arrays, signature, tasks, "", required=True)
    train = _split(where, arrays, signature, tasks, TRAIN, required=False)
    return EvalData(validation, train, source, origin, overlap_of(validation, train))


CALLABLE_FORM = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def is_callable_spec(value: str) -> bool:
    """True for "package.module:function" (and not for an existing file)."""
    return bool(CALLABLE_FORM.match(value)) and not Path(value).exists()


def load_callable(spec: str, signature: Signature, tasks: tuple[Task, ...]) -> EvalData:
    """Data from a user function returning (train, validation).

    This imports and runs the user's own code, which is why it only happens
    for this explicit form. Each part may be (x, y) arrays (x a list or dict
    per input for several inputs), a tf.data.Dataset of (x, y), or None for
    train.
    """
    module_name, function_name = spec.split(":")
    module = import_module(module_name, f"--data {spec}")
    function = getattr(module, function_name, None)
    if not callable(function):
        raise MpconvertError(
            f"--data {spec}: module {module_name!r} has no function {function_name!r}",
            hint="name a function defined in that module, e.g. --data mydata:load",
        )
    try:
        result = function()
    except Exception as exc:
        raise MpconvertError(
            f"--data {spec}: the function raised {type(exc).__name__}: {exc}",
            hint="fix the data function; run it alone in Python to see the full error",
        ) from exc
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise MpconvertError(
            f"--data {spec} returned {type(result).__name__}, expected a pair (train, validation)",
            hint="return (train, validation), each (x, y) arrays or a tf.data.Dataset of (x, y); train may be None",
        )
    return _from_parts(f"--data {spec}", result[0], result[1], signature, tasks, DataSource.CALLABLE, spec)


def _from_parts(
    where: str,
    train,
    validation,
    signature: Signature,
    tasks: tuple[Task, ...],
    source: DataSource,
    origin: str | None = None,
) -> EvalData:
    """EvalData from (x, y) pairs or Datasets, checked like an .npz's arrays."""
    if validation is None:
        raise MpconvertError(f"{where} has no validation data", hint="give (train, validation); train may be None")
    arrays: dict[str, np.ndarray] = {}
    for part, suffix in ((train, TRAIN), (validation, "")):
        if part is None:
            continue
        x, y = _materialize(where, part, signature, suffix)
        arrays.update(zip(input_keys(signature, suffix), x))
        which = "train" if suffix else "validation"
        labels = _per_output(where, y, signature, which)
        arrays.update({key: y for key, y in zip(label_keys(signature, suffix), labels) if y is not None})
    return _eval_data(where, arrays, signature, tasks, source, origin)


def _materialize(spec: str, part, signature: Signature, suffix: str) -> tuple[list[np.ndarray], Any]:
    which = "train" if suffix else "validation"
    if hasattr(part, "as_numpy_iterator"):  # a tf.data.Dataset
        elements = list(part.as_numpy_iterator())
        if not elements:
            raise MpconvertError(f"{spec}: the {which} dataset is empty", hint="return at least one sample")
        if not (isinstance(elements[0], tuple) and len(elements[0]) == 2):
            raise MpconvertError(
                f"{spec}: the {which} dataset yields {type(elements[0]).__name__}, expected (x, y) pairs",
                hint="map it to (inputs, labels), e.g. ds.map(lambda r: (r['image'], r['label']))",
            )
        xs = [_per_input(spec, e[0], signature, which) for e in elements]
        batched = xs[0][0].ndim == len(signature.inputs[0].shape)
        join = np.concatenate if batched else np.stack
        x = [join([sample[i] for sample in xs]) for i in range(len(signature.inputs))]
        ys = [_per_output(spec, e[1], signature, which) for e in elements]
        labels = [None if column[0] is None else join(column) for column in zip(*ys)]
        return x, labels if len(signature.outputs) > 1 else labels[0]
    if not (isinstance(part, (tuple, list)) and len(part) == 2):
        raise MpconvertError(
            f"{spec}: the {which} part is {type(part).__name__}, expected (x, y) or a tf.data.Dataset",
            hint="return (train, validation), each as (x, y)",
        )
    return _per_input(spec, part[0], signature, which), part[1]


def _per_output(spec: str, y, signature: Signature, which: str) -> list[np.ndarray | None]:
    """Labels as one entry per output (None for an output without them): a dict by name, a list, or an array."""
    names = [s.name for s in signature.outputs]
    if len(names) == 1:
        if isinstance(y, dict):
            if len(y) > 1:  # one output reads one array: every other key would be dropped unread
                raise MpconvertError(
                    f"{spec}: the {which} labels have keys {', '.join(map(repr, y))}, but the model has one "
                    f"output, {names[0]!r}",
                    hint=f"give its labels as an array, or as a dict with the one key {names[0]!r}",
                )
            y = next(iter(y.values()), None)
        return [None if y is None else np.asarray(y)]
    if isinstance(y, dict) and signature.output_keys:
        # Labels keyed as the model returns its outputs (the dict keys it was
        # trained with) read as by output name, where the key names no other output.
        by_key = {key: name for key, name in zip(signature.output_keys, names) if key not in names}
        renamed = [by_key.get(k, k) for k in y]
        if len(set(renamed)) < len(renamed):
            raise MpconvertError(
                f"{spec}: the {which} labels give an output twice, by its output name and by its dict key",
                hint=f"keep one key per output: {', '.join(names)} or {', '.join(signature.output_keys)}",
            )
        y = dict(zip(renamed, y.values()))
    if isinstance(y, dict):
        unknown = [k for k in y if k not in names]
        if unknown:
            raise MpconvertError(
                f"{spec}: the {which} labels name an output {unknown[0]!r} the model does not have"
                + did_you_mean(str(unknown[0]), names),
                hint=f"key the labels by output name: {', '.join(names)} (any may be left out)",
            )
        return [None if y.get(n) is None else np.asarray(y[n]) for n in names]
    if isinstance(y, (list, tuple)) and len(y) == len(names):
        return [None if a is None else np.asarray(a) for a in y]
    raise MpconvertError(
        f"{spec}: the model has {len(names)} outputs ({', '.join(names)}), but the {which} labels are "
        f"{type(y).__name__}" + (f" of {len(y)}" if isinstance(y, (list, tuple)) else ""),
        hint="give a dict of labels by output name (outputs without labels may be left out), "
        "or a list with one entry per output",
    )


def _per_input(spec: str, x, signature: Signature, which: str) -> list[np.ndarray]:
    names = [s.name for s in signature.inputs]
    if isinstance(x, dict):
        known = [key for choices in input_key_choices(signature, "") for key in choices]
        unknown = [k for k in x if k not in known]
        if unknown:
            raise MpconvertError(
                f"{spec}: the {which} inputs have a key {unknown[0]!r}{did_you_mean(str(unknown[0]), known)}, "
                "which is not an input of the model",
                hint=f"name the inputs {', '.join(signature.input_keys or names)}",
            )
        keys = pick_input_keys(f"{spec}: the {which} inputs", x, signature, "")
        missing = [k for k in keys if k not in x]
        if missing:
            raise MpconvertError(
                f"{spec}: the {which} inputs have no {missing[0]!r} (they have {', '.join(map(str, x))})",
                hint=f"name the inputs {', '.join(signature.input_keys or names)}",
            )
        return [np.asarray(x[k]) for k in keys]
    if isinstance(x, (list, tuple)) and len(names) > 1:
        return [np.asarray(a) for a in x]
    return [np.asarray(x)]


@overload
def _split(
    where: str,
    arrays: Mapping[str, np.ndarray],
    signature: Signature,
    tasks: tuple[Task, ...],
    suffix: str,
    required: Literal[True],
) -> Split: ...


@overload
def _split(
    where: str,
    arrays: Mapping[str, np.ndarray],
    signature: Signature,
    tasks: tuple[Task, ...],
    suffix: str,
    required: Literal[False],
) -> Split | None: ...


def _split(
    where: str,
    arrays: Mapping[str, np.ndarray],
    signature: Signature,
    tasks: tuple[Task, ...],
    suffix: str,
    required: bool,
) -> Split | None:
    choices = input_key_choices(signature, suffix)
    keys = pick_input_keys(where, arrays, signature, suffix)
    labels_at = pick_label_keys(where, arrays, signature, suffix)
    several = len(labels_at) > 1
    present = [k for k in keys + labels_at if k in arrays]
    if not present and not required:
        return None
    either = {c[0]: " or ".join(c) for c in choices}  # "x or pixels": a single input's two keys
    expected = ", ".join(f"{either[c[0]]} {s.describe()}" for c, s in zip(choices, signature.inputs))
    wanted = f"labels {labels_at[0]} with one row per sample" if not several else "labels " + ", ".join(labels_at)
    missing = [k for k in keys if k not in arrays] + ([] if several else [k for k in labels_at if k not in arrays])
    if several and not any(k in arrays for k in labels_at):
        missing.append(labels_at[0])
    if missing:
        found = f"it has: {', '.join(sorted(arrays)) or 'nothing'}"
        plain = "y" + suffix
        hint = f"the model expects {expected} and {wanted}"
        if several and plain in arrays:
            hint = (
                f"the model has {len(labels_at)} outputs, so its labels are named after them "
                f"({', '.join(labels_at)}; any may be left out), not {plain!r}"
            )
        also = "".join(f" or {k!r}" for k in next((c[1:] for c in choices if c[0] == missing[0]), ()))
        raise MpconvertError(f"{where} has no key {missing[0]!r}{also} ({found})", hint=hint)
    inputs = tuple(check_input(where, key, arrays[key], spec) for key, spec in zip(keys, signature.inputs))
    labels = tuple(
        check_labels(where, key, arrays[key], task, task.padding.positions(inputs) if task.padding else None)
        if key in arrays
        else None
        for key, task in zip(labels_at, tasks)
    )
    for key, array in zip(keys, inputs):
        for label_key, y in zip(labels_at, labels):
            if y is not None and len(array) != len(y):
                raise MpconvertError(
                    f"{where}: {key!r} has {len(array)} rows but {label_key!r} has {len(y)}",
                    hint="inputs and labels need one row per sample",
                )
    return Split(inputs, labels)


def evaluation_data(model: Any, signature: Signature, tasks: tuple[Task, ...], options: Any, seed: int) -> EvalData:
    """The validation data given (`options.data`, a ValidateOptions), else inputs generated from `seed`, for drift only."""
    given = resolve_data(options.data, signature, tasks)
    if given is not None:
        return given
    inputs = generate_inputs(model, signature, options.generated_samples, seed)
    return EvalData(unlabelled(inputs, signature), None, DataSource.GENERATED)
