"""The LiteRT file (model.tflite): float16 weights, float32 inputs and outputs.

TensorFlow's LiteRT converter has no builtin kernels for a mixed-precision
graph's float16 MatMul or Conv ("'tf.MatMul' op is neither a custom op nor
a flex op"), and mobile and edge runtimes store float16 weights and choose
the compute precision themselves: the CPU interpreter dequantizes them and
computes in float32, the GPU delegate computes in float16. So the file is
converted from the converted model's float32-computing copy (the same
weights, every layer in float32), with post-training float16 quantization
of the weights, the standard way to halve a .tflite file; its parity is
judged against the converted model like every other artifact's.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from mpconvert.data.signature import Signature
from mpconvert.export.artifacts import parity, serving_batches
from mpconvert.export.formats.base import Format, LiteRTFile, Writes
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.options.convert import ExportOptions
from mpconvert.report.sections import Artifact
from mpconvert.report.sections.details import LiteRTDetails
from mpconvert.runners.litert import LiteRTRunner
from mpconvert.system.errors import MpconvertError, NotExportable
from mpconvert.system.writing import replace_atomically

WHAT = (
    "float16 weights, float32 inputs and outputs; the CPU interpreter dequantizes the weights and computes in "
    "float32, the GPU delegate computes in float16; an empty request runs on one row of zeros, cut away"
)


class LiteRT(Format[LiteRTFile, LiteRTDetails]):
    name = ArtifactKind.LITERT
    filename = "model.tflite"
    details = LiteRTDetails
    runtime = "tensorflow"  # the interpreter TensorFlow ships, or ai-edge-litert's where it is installed

    def write(self, writes: Writes, path: Path, options: ExportOptions) -> LiteRTFile:
        return writes.litert(path)

    def recorded(self, written: LiteRTFile) -> LiteRTDetails:
        return LiteRTDetails(weights=written.weights, what=WHAT, tables=written.tables or None)

    def open(
        self,
        path: Path,
        details: LiteRTDetails,
        signature: Signature,
        providers: Sequence[str] = (),
        device: str | None = None,
    ) -> LiteRTRunner:
        return LiteRTRunner(path, signature)

    def check(
        self, written: LiteRTFile, path: Path, rows: list[np.ndarray], expected: list[np.ndarray], signature: Signature
    ) -> Artifact:
        runner = self.open(path, self.recorded(written), signature)
        run = runner.run(rows)
        details = replace(self.recorded(written), tensor_dtypes=runner.tensor_dtypes())
        batches = serving_batches(runner, rows, expected)
        return parity(self.name, path, expected, run.outputs, run.checked_with, details, signature, batches=batches)


LITERT = LiteRT()


@contextlib.contextmanager
def _stderr_hidden() -> Iterator[None]:
    """The converter writes its MLIR dumps to the C++ stderr; its exception carries what matters."""
    saved = os.dup(2)
    with open(os.devnull, "w") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def builtin_tables(model: Any) -> tuple[str, ...]:
    """Give `model`'s integer tables (IntegerLookup's int64 -> int64) LiteRT's builtin tables, in place.

    LiteRT's HASHTABLE kernels map string -> int64 and int64 -> string
    only, and the converter legalizes a model's tables only when every one
    fits. An int64 -> int64 table is the same lookup as two it holds:
    int64 -> the entry's index as text -> int64; a key in neither gets the
    text "", which no entry has, so the original default value. For the
    float32-computing copy the .tflite file is converted from; returns
    what it changed, for the report.
    """
    import tensorflow as tf

    class ThroughText(tf.Module):
        def __init__(self, table: Any):
            super().__init__()
            keys, values = table.export()
            names = tf.strings.as_string(tf.range(tf.size(keys, out_type=tf.int64)))
            self.to_name = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, names), "")
            self.to_value = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(names, values), table.default_value
            )

        def lookup(self, keys: Any) -> Any:
            return self.to_value.lookup(self.to_name.lookup(keys))

    changed = []
    for layer in model._flatten_layers(include_self=False):
        table = getattr(layer, "lookup_table", None)
        types = (getattr(table, "key_dtype", None), getattr(table, "value_dtype", None))
        if types == (tf.int64, tf.int64) and hasattr(table, "export"):
            layer.lookup_table = ThroughText(table)
            changed.append(f"{layer.name}: int64 -> int64 as int64 -> string -> int64")
    return tuple(changed)


def write_litert(
    saved_model: Path,
    path: Path,
    float16_weights: bool = True,
    unit_of: Callable[[str], str | None] = lambda n: None,
    tables: tuple[str, ...] = (),
) -> LiteRTFile:
    """A .tflite file at `path` from a float32-computing SavedModel, weights stored in float16 when asked.

    `unit_of(node name)` names the layer (or node) behind an op the converter refuses; `tables` says which
    tables `builtin_tables` rewrote, for the report.
    """
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
    if float16_weights:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    try:
        with _stderr_hidden():
            data = converter.convert()
    except Exception as exc:  # the converter's own errors: ops LiteRT has no builtin kernel for
        raise refusal(str(exc), unit_of) from None
    replace_atomically(path, data, "the LiteRT file")
    return LiteRTFile(path, "float16" if float16_weights else "float32", tables)


_SERVE_OTHERS = "serve the SavedModel or the ONNX file (--export savedmodel,onnx)"
# Select TF ops would carry any TensorFlow op, in a file that needs the Flex delegate; the interpreter here
# (TensorFlow's, and ai-edge-litert's) has none ("Select TensorFlow op(s) ... not supported by this
# interpreter"), so such a file could not be re-run and checked, and is not written.
_NO_FLEX = (
    "Select TF ops would carry it only in a file that needs the Flex delegate, which the interpreter here "
    "lacks, so it could not be checked"
)
_TABLE_OPS = ("HashTableV2", "MutableHashTableV2", "LookupTableFindV2", "LookupTableImportV2", "LookupTableSizeV2")
# The key -> value types of LiteRT's builtin HASHTABLE kernels. The converter turns a model's tables into
# them only when every table fits, so one IntegerLookup (int64 -> int64) fails StringLookup's tables too.
_BUILTIN_TABLES = {("string", "int64"), ("int64", "string")}
_MLIR_TYPES = {"i64": "int64", "i32": "int32", "!tf_type.string": "string", "f32": "float32"}
# Ops no LiteRT builtin computes, what they are, and what to move in front of the model.
_NO_BUILTIN = {
    "StringToHashBucketFast": ("Keras's Hashing (FarmHash Fingerprint64)", "the hash"),
    "StringToHashBucketStrong": ("a keyed string hash", "the hash"),
    "SparseCross": ("crossing features (a FarmHash of the crossed values)", "the crossed feature's ids"),
    "SparseCrossHashed": ("crossing features (a FarmHash of the crossed values)", "the crossed feature's ids"),
    "SparseCrossV2": ("crossing features", "the crossed feature's ids"),
    "StaticRegexReplace": ("a regular-expression replace (text standardization)", "the text standardization"),
    "RegexReplace": ("a regular-expression replace (text standardization)", "the text standardization"),
    "StringSplitV2": ("splitting text", "the split"),
    "DenseBincount": ("CategoryEncoding's counting (tf.math.bincount)", "the encoding"),
}
_ERROR = re.compile(r"error: loc\((.*)\): '(?:tf|tfl)\.(\w+)' op ")
_NODE = re.compile(r'fused\["(\w+):", "([^"@]+)')
# A table lookup's operands: (the table, the keys, the default value).
_FIND_TYPES = re.compile(
    r"LookupTableFindV2\"\([^)]*\)[^\n]*? : \(tensor<[^>]*>, tensor<(?:[?\dx]*x)?([^>]+)>, tensor<([^>]+)>\)"
)


@dataclass(frozen=True)
class _Refused:
    op: str
    unit: str | None  # the layer (or node) it belongs to, where one is named
    table: tuple[str, str] | None = None  # a lookup's key and value types


def _refused(text: str, unit_of: Callable[[str], str | None]) -> list[_Refused]:
    """Every op the converter refused, in its order, from its error blocks (an error line, then its notes)."""
    found = []
    blocks = re.split(r"(?=<unknown>:0: error: )", text)
    for block in blocks:
        error = _ERROR.search(block)
        if error is None:
            continue
        location, op = error.groups()
        names = [name for kind, name in _NODE.findall(location) if kind == op]
        unit = next((unit_of(n) for n in names if unit_of(n)), None)
        types = _FIND_TYPES.search(block) if op == "LookupTableFindV2" else None
        table = tuple(_MLIR_TYPES.get(t, t) for t in types.groups()) if types else None
        found.append(_Refused(op, unit, table))  # type: ignore[arg-type]
    return found


def refusal(text: str, unit_of: Callable[[str], str | None]) -> MpconvertError:
    """The converter's error as one line that names the op, its layer and the model's own cause.

    Lookup tables whose key and value types LiteRT's builtin tables take (string -> int64, int64 -> string:
    StringLookup, and IntegerLookup's through `builtin_tables`) convert; another table, a hash, a cross, a
    regular expression or a bincount is refused as not exportable to LiteRT, so the other files serve the model;
    anything else is the converter failing (an LSTM's TensorList ops at a variable batch among them).
    """
    refused = _refused(text, unit_of)
    if not refused:
        lines = [line for line in text.splitlines() if "error:" in line] or text.splitlines() or [""]
        reason = lines[0].split("error:", 1)[-1].strip()[:300]
        return MpconvertError(f"the LiteRT converter cannot convert this model: {reason}", hint=_SERVE_OTHERS)
    tables = [r for r in refused if r.table is not None and r.table not in _BUILTIN_TABLES]
    # The table ops fail with the table that does not fit; the rest of them are not causes of their own.
    causes = tables + [r for r in refused if r.op not in _TABLE_OPS]
    if not causes:
        causes = refused
    first = min(causes, key=lambda r: (r.unit is None, r.table is None and r.op not in _NO_BUILTIN))
    where = f"layer '{first.unit}' ({first.op})" if first.unit else f"op {first.op}"
    others = sorted({f"{r.op} in '{r.unit}'" if r.unit else r.op for r in causes if r is not first} - {where})
    also = f" (also {', '.join(others)})" if others else ""
    if first.table is not None:
        key, value = first.table
        return NotExportable(
            f"not exportable to LiteRT: {where}: {'an' if key[:1] in 'aeiou' else 'a'} {key} -> {value} lookup table, and LiteRT's builtin tables map "
            f"string -> int64 or int64 -> string only; {_NO_FLEX}{also}",
            hint=f"look the ids up as text with StringLookup (a builtin table), or {_SERVE_OTHERS}",
        )
    if first.op in _NO_BUILTIN:
        what, step = _NO_BUILTIN[first.op]
        return NotExportable(
            f"not exportable to LiteRT: {where}: {what} has no LiteRT builtin; {_NO_FLEX}{also}",
            hint=f"compute {step} before the model, or {_SERVE_OTHERS}",
        )
    op = first.op
    if op.startswith("TensorList"):
        hint = f"give recurrent layers a fixed sequence length (they are unrolled for LiteRT), or {_SERVE_OTHERS}"
    else:
        hint = _SERVE_OTHERS
    return MpconvertError(f"the LiteRT converter has no builtin for {where}{also}", hint=hint)
