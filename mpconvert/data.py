"""Labelled data from an `.npz` file, checked against the model before use.

Format: `x` and `y` for a single-input model; for several inputs one array
per input, named after the input, plus `y`. Optional `x_train`/`y_train`
(or `<input>_train`) are training splits for fine-tuning. Every problem is
reported with the key and the expected shape, before anything is written.
"""

from __future__ import annotations

import contextlib
import math
import re
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import MpconvertError
from .memory import available_memory
from .signature import Signature, TensorSpec
from .usercode import import_module


@dataclass(frozen=True)
class Task:
    """What the first model output means, which decides metric and labels."""

    kind: str  # "softmax", "sigmoid" or "regression"
    output: TensorSpec

    @property
    def classes(self) -> int | None:
        return self.output.shape[-1] if self.kind == "softmax" else None

    def scored_by(self, labels: np.ndarray | None) -> Task:
        """The task as its checked labels score it: a sigmoid output is not always a binary classifier.

        Class ids (n,) for a Dense(k > 1, "sigmoid") output are scored like a
        softmax (argmax accuracy); targets in [0, 1] that are not all 0/1
        (reconstructions, probabilities) like a regression (mse, no
        agreement); 0/1 labels shaped like the output keep the per-unit rule.
        """
        if self.kind != "sigmoid" or labels is None:
            return self
        if labels.ndim == 1 and sigmoid_units(self):
            return Task("softmax", self.output)
        if not ((labels == 0) | (labels == 1)).all():
            return Task("regression", self.output)
        return self


@dataclass(frozen=True)
class Split:
    inputs: tuple[np.ndarray, ...]
    labels: np.ndarray | None

    @property
    def rows(self) -> int:
        return len(self.inputs[0])


@dataclass(frozen=True)
class EvalData:
    validation: Split
    train: Split | None
    source: str  # "npz" or "generated"
    path: str | None = None


def input_keys(signature: Signature, suffix: str = "") -> list[str]:
    if len(signature.inputs) == 1:
        return ["x" + suffix]
    return [spec.name + suffix for spec in signature.inputs]


def resolve_data(spec: Any, signature: Signature, task: Task) -> EvalData | None:
    """Labelled data in any form the CLI or the Python API accepts; None when none was given.

    A path (an .npz file), "module:function" (its result as below), or, from
    Python: (x, y) arrays, (train, validation) as a tuple of two such pairs
    (train may be None), a tf.data.Dataset of (x, y) for validation, or a
    (train, validation) tuple of Datasets. x is an array, or a list or dict
    (by input name) of arrays for a model with several inputs.
    """
    if spec is None:
        return None
    if isinstance(spec, (str, Path)):
        if isinstance(spec, str) and is_callable_spec(spec):
            return load_callable(spec, signature, task)
        return load_npz(Path(spec), signature, task)
    train, validation = _train_and_validation(spec)
    return _from_parts("data", train, validation, signature, task, "arrays")


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


def load_npz(path: Path, signature: Signature, task: Task) -> EvalData:
    with _open_npz(path) as arrays:
        try:
            return _eval_data(f"data file {path}", arrays, signature, task, "npz", str(path))
        except MemoryError:
            # Checking converts the arrays (astype, isfinite), which needs
            # memory beside them; reading itself is guarded per key.
            raise MpconvertError(f"ran out of memory while checking data file {path}", hint=_SMALLER_SPLIT) from None


def _eval_data(
    where: str, arrays: Mapping[str, np.ndarray], signature: Signature, task: Task, source: str, origin: str | None
) -> EvalData:
    validation = _split(where, arrays, signature, task, "", required=True)
    train = _split(where, arrays, signature, task, "_train", required=False)
    return EvalData(validation, train, source, origin)


CALLABLE_FORM = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def is_callable_spec(value: str) -> bool:
    """True for "package.module:function" (and not for an existing file)."""
    return bool(CALLABLE_FORM.match(value)) and not Path(value).exists()


def load_callable(spec: str, signature: Signature, task: Task) -> EvalData:
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
    return _from_parts(f"--data {spec}", result[0], result[1], signature, task, "callable", spec)


def _from_parts(
    where: str, train, validation, signature: Signature, task: Task, source: str, origin: str | None = None
) -> EvalData:
    """EvalData from (x, y) pairs or Datasets, checked like an .npz's arrays."""
    if validation is None:
        raise MpconvertError(f"{where} has no validation data", hint="give (train, validation); train may be None")
    arrays: dict[str, np.ndarray] = {}
    for part, suffix in ((train, "_train"), (validation, "")):
        if part is None:
            continue
        x, y = _materialize(where, part, signature, suffix)
        arrays.update(zip(input_keys(signature, suffix), x))
        arrays["y" + suffix] = y
    return _eval_data(where, arrays, signature, task, source, origin)


def _materialize(spec: str, part, signature: Signature, suffix: str) -> tuple[list[np.ndarray], np.ndarray]:
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
        return x, join([np.asarray(e[1]) for e in elements])
    if not (isinstance(part, (tuple, list)) and len(part) == 2):
        raise MpconvertError(
            f"{spec}: the {which} part is {type(part).__name__}, expected (x, y) or a tf.data.Dataset",
            hint="return (train, validation), each as (x, y)",
        )
    return _per_input(spec, part[0], signature, which), np.asarray(part[1])


def _per_input(spec: str, x, signature: Signature, which: str) -> list[np.ndarray]:
    names = [s.name for s in signature.inputs]
    if isinstance(x, dict):
        missing = [n for n in names if n not in x]
        if missing:
            raise MpconvertError(
                f"{spec}: the {which} inputs have no {missing[0]!r} (they have {', '.join(map(str, x))})",
                hint=f"name the inputs {', '.join(names)}",
            )
        return [np.asarray(x[n]) for n in names]
    if isinstance(x, (list, tuple)) and len(names) > 1:
        return [np.asarray(a) for a in x]
    return [np.asarray(x)]


_SMALLER_SPLIT = "store a smaller validation split, e.g. a few thousand rows"
_NPY_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


@contextlib.contextmanager
def _open_npz(path: Path) -> Iterator[_NpzArrays]:
    if not path.is_file():
        raise MpconvertError(f"data file not found: {path}", hint="pass an existing .npz file with --data")
    try:
        archive = zipfile.ZipFile(path)
    except Exception as exc:  # any failure to parse the zip directory is the file's
        raise _unreadable(path, exc) from exc
    with archive:
        yield _NpzArrays(path, archive)


class _NpzArrays(Mapping):
    """The arrays of an open .npz by key, each read only when looked up.

    Keys come from the zip directory (members are `KEY.npy`, as np.savez
    writes them), so listing or testing keys reads no data and members that
    are never looked up are never decompressed. Nothing is cached: a looked-up
    array is freed as soon as the caller drops it.
    """

    def __init__(self, path: Path, archive: zipfile.ZipFile):
        self._path = path
        self._archive = archive
        self._members = {name.removesuffix(".npy"): name for name in archive.namelist()}

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, key: object) -> bool:
        return key in self._members  # Mapping's default would read the array

    def __getitem__(self, key: str) -> np.ndarray:
        info = self._archive.getinfo(self._members[key])
        shape, dtype = self._checked_header(key, info)
        try:
            with self._archive.open(info) as fp:
                # allow_pickle=False: an .npz can carry pickled objects, which
                # would run code on load; labelled data never needs them.
                return np.lib.format.read_array(fp, allow_pickle=False)
        except MemoryError:
            raise MpconvertError(
                f"ran out of memory reading {key!r} {shape} {dtype} from {self._path}", hint=_SMALLER_SPLIT
            ) from None
        except Exception as exc:  # zlib, CRC, EOF, ...: whatever a damaged member raises
            raise _unreadable(self._path, exc) from exc

    def _checked_header(self, key: str, info: zipfile.ZipInfo) -> tuple[tuple[int, ...], np.dtype]:
        """The member's declared shape and dtype, refused before any data is read
        if the data could not be there or could not fit in memory."""
        try:
            with self._archive.open(info) as fp:
                version = np.lib.format.read_magic(fp)
                if version not in _NPY_HEADER_READERS:
                    raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
                shape, _, dtype = _NPY_HEADER_READERS[version](fp)
                header_bytes = fp.tell()
        except Exception as exc:  # a bad header, or a damaged zip entry
            raise _unreadable(self._path, exc) from exc
        declared = f"{key!r} declares shape {shape} {dtype}"
        if dtype.hasobject:
            raise MpconvertError(
                f"{self._path} holds object arrays ({key!r}), which could only be read by unpickling them",
                hint="save plain numeric arrays, e.g. np.savez(path, x=x.astype('float32'), y=y)",
            )
        size = math.prod(shape) * dtype.itemsize
        stored = info.file_size - header_bytes
        if size > stored:
            raise MpconvertError(
                f"data file {self._path}: {declared} ({_bytes(size)}) but holds only {_bytes(stored)}: "
                "the file is truncated or its header does not match its data",
                hint="write the file again with np.savez or np.savez_compressed",
            )
        available = available_memory()
        if available is not None and size > available:
            raise MpconvertError(
                f"data file {self._path}: {declared} ({_bytes(size)}), "
                f"more than the {_bytes(available)} of memory available",
                hint=_SMALLER_SPLIT,
            )
        return shape, dtype


def _bytes(n: int) -> str:
    """Like "64.0 TiB", in integers: a header may declare more than a float holds."""
    units = ("KiB", "MiB", "GiB", "TiB")
    power = min(len(units), max(0, (n.bit_length() - 1) // 10))
    if power == 0:
        return f"{n} bytes"
    tenths = n * 10 >> (10 * power)
    return f"{tenths // 10}.{tenths % 10} {units[power - 1]}"


def _unreadable(path: Path, exc: Exception) -> MpconvertError:
    return MpconvertError(
        f"cannot read data file {path}: {exc}",
        hint="write it with np.savez or np.savez_compressed",
    )


def _split(
    where: str, arrays: Mapping[str, np.ndarray], signature: Signature, task: Task, suffix: str, required: bool
) -> Split | None:
    keys = input_keys(signature, suffix)
    label_key = "y" + suffix
    present = [k for k in keys + [label_key] if k in arrays]
    if not present and not required:
        return None
    missing = [k for k in keys + [label_key] if k not in arrays]
    if missing:
        expected = ", ".join(f"{k} {s.describe()}" for k, s in zip(keys, signature.inputs))
        raise MpconvertError(
            f"{where} has no key {missing[0]!r} (it has: {', '.join(sorted(arrays)) or 'nothing'})",
            hint=f"the model expects {expected} and labels {label_key} with one row per sample",
        )
    inputs = tuple(_check_input(where, key, arrays[key], spec) for key, spec in zip(keys, signature.inputs))
    labels = _check_labels(where, label_key, arrays[label_key], task)
    for key, array in zip(keys, inputs):
        if len(array) != len(labels):
            raise MpconvertError(
                f"{where}: {key!r} has {len(array)} rows but {label_key!r} has {len(labels)}",
                hint="inputs and labels need one row per sample",
            )
    return Split(inputs, labels)


def _check_input(where: str, key: str, array: np.ndarray, spec: TensorSpec) -> np.ndarray:
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
    if not np.issubdtype(array.dtype, np.integer):
        raise MpconvertError(
            f"{where}: {key!r} has dtype {array.dtype}, {expected}",
            hint="integer inputs (token ids) must be stored as integers",
        )
    return array.astype(spec.dtype)


def _check_labels(where: str, key: str, labels: np.ndarray, task: Task) -> np.ndarray:
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
    if task.kind == "softmax":
        classes = task.classes
        if labels.ndim == 2 and labels.shape[1] == classes and classes > 1:
            labels = _one_hot_to_ids(where, key, labels)
        if labels.ndim == 2 and labels.shape[1] == 1:
            labels = labels[:, 0]
        if labels.ndim != 1:
            raise MpconvertError(
                f"{where}: {key!r} has shape {labels.shape}, expected (n,) class ids "
                f"in [0, {classes}) or (n, {classes}) one-hot rows",
                hint="store one integer class id per sample",
            )
        return _class_ids(where, key, labels, classes, out)
    units = sigmoid_units(task)
    if units and labels.shape[1:] in ((), (1,)):
        # Class ids for a Dense(k > 1, "sigmoid") output: scored by argmax.
        return _class_ids(where, key, labels.reshape(-1), units, out)
    row_shape = tuple(d or 1 for d in out.shape[1:])
    if labels.shape[1:] != row_shape:
        # (n,) targets for an (n, 1) output are the same thing
        if int(np.prod(labels.shape[1:])) != int(np.prod(row_shape)):
            raise MpconvertError(
                f"{where}: {key!r} has shape {labels.shape}, expected {out.describe()} like output {out.name!r}",
                hint="store one target row per sample, shaped like the model output",
            )
        labels = labels.reshape((len(labels),) + row_shape)
    labels = labels.astype(np.float32)
    if task.kind == "sigmoid" and (labels.min() < 0.0 or labels.max() > 1.0):
        raise MpconvertError(
            f"{where}: {key!r} must hold 0/1 labels or targets in [0, 1] for sigmoid output {out.name!r} "
            f"(found values from {labels.min():g} to {labels.max():g})",
            hint="store binary labels as 0 and 1 (or class ids (n,) for a sigmoid output with several units)",
        )
    return labels


def sigmoid_units(task: Task) -> int | None:
    """k for a (None, k > 1) sigmoid output, which (n,) class ids can label; else None."""
    shape = task.output.shape
    if task.kind != "sigmoid" or len(shape) != 2 or not shape[-1] or shape[-1] < 2:
        return None
    return shape[-1]


def _class_ids(where: str, key: str, labels: np.ndarray, classes: int, out: TensorSpec) -> np.ndarray:
    if not np.all(np.equal(np.mod(labels, 1), 0)):
        raise MpconvertError(f"{where}: {key!r} holds non-integer class ids", hint="store integer class ids")
    if labels.min() < 0 or labels.max() >= classes:
        raise MpconvertError(
            f"{where}: {key!r} has labels from {labels.min():g} to {labels.max():g}, "
            f"but output {out.name!r} has {classes} classes (0 to {classes - 1})",
            hint="check that the labels belong to this model",
        )
    return labels.astype(np.int64)


def _one_hot_to_ids(where: str, key: str, labels: np.ndarray) -> np.ndarray:
    if not (np.isin(labels, (0, 1)).all() and np.all(labels.sum(axis=1) == 1)):
        raise MpconvertError(
            f"{where}: {key!r} has one column per class but its rows are not one-hot",
            hint="store class ids (n,) or exact one-hot rows",
        )
    return labels.argmax(axis=1)
