"""Checks on a converted ONNX graph, naming the Keras layer behind a problem.

Unconverted TensorFlow ops, inputs the model does not have (captured
tensors), the 2 GiB protobuf limit and onnx.checker's full check (of the
written file by path, for one with external data): each a
clear MpconvertError with the layer to keep float32 where one is to blame.
Imports onnx only (the layer lookup reads the Keras model's layer names).
"""

from __future__ import annotations

import contextlib

import onnx

from mpconvert.onnx.proto import fed_inputs, graphs, schema
from mpconvert.system.errors import MpconvertError, NotExportable, first_line

__all__ = [
    "INEXPRESSIBLE",
    "NotExportable",
    "TooLarge",
    "check",
    "check_file",
    "check_inputs",
    "layer_of",
    "refuse_inexpressible",
    "reject_unconverted_ops",
]

PROTOBUF_LIMIT = 2**31 - 1


class TooLarge(MpconvertError):
    """A size limit no setting gets past: the run stops (exit 1) instead of reporting a failed artifact."""


def layer_of(node_name, model):
    """Best guess at the Keras layer a converted node came from.

    A layer inside a nested model is named "outer/inner", as --keep-float32
    accepts it.
    """
    with contextlib.suppress(Exception):
        # Keras 3 on TF enters each layer's name scope twice, so TF makes
        # "dense" unique as "dense_1", and a layer named "dense_1" shows as
        # "dense_1_1": with both layers present, "dense_1" is "dense". tf-keras
        # enters it once; only a shared layer's later calls get a suffix.
        keras3 = any(c.__module__.split(".")[0] == "keras" for c in type(model).__mro__)
        found, layers = [], {layer.name: layer for layer in model.layers}
        for part in node_name.split("/"):
            names = [part]
            base, _, suffix = part.rpartition("_")
            if base and suffix.isdigit():
                names = [base, part] if keras3 else [part, base]
            layer = next((layers[n] for n in names if n in layers), None)
            if layer is None:
                continue
            found.append(layer.name)
            layers = {inner.name: inner for inner in getattr(layer, "layers", None) or []}
            if not layers:
                break
        return "/".join(found) or None
    return None


# Call wrappers are unconvertible because of what they call, so they are
# named after the ops that are unconvertible themselves.
_CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")


# TensorFlow ops whose meaning no ONNX operator has (tf2onnx leaves them unconverted, or maps them to a
# contrib domain that ONNX Runtime does not ship), each with why and the step a user can move in front of
# the model to get an ONNX file. One rule for all of them: the ONNX file is refused (NotExportable) before
# tf2onnx runs, and again if one is left unconverted after it.
_HASH = "the hash"
_CROSS = "the crossed feature's ids"
_STANDARDIZE = "the text standardization (TextVectorization(standardize=None) on text cleaned beforehand)"
_FARMHASH = "FarmHash Fingerprint64, which no ONNX operator computes"
INEXPRESSIBLE = {
    "StringToHashBucketFast": (f"Keras's Hashing hashes with {_FARMHASH}", _HASH),
    "StringToHashBucketStrong": ("a keyed SipHash, which no ONNX operator computes", _HASH),
    "StringToHashBucket": ("TensorFlow's own string hash, which no ONNX operator computes", _HASH),
    "Fingerprint": (f"a fingerprint with {_FARMHASH}", _HASH),
    # HashedCrossing and FeatureSpace.cross: tf.sparse.cross_hashed is a SparseCross with hashed_output.
    "SparseCross": (f"crossing features hashes the crossed values with {_FARMHASH}", _CROSS),
    "SparseCrossHashed": (f"crossing features hashes the crossed values with {_FARMHASH}", _CROSS),
    "SparseCrossV2": (
        "crossing features joins their values as text per combination, which no ONNX operator does",
        _CROSS,
    ),
    # TextVectorization's default standardization (lower case, strip punctuation); ONNX has a
    # regular-expression match (RegexFullMatch, opset 20) but no replace.
    "StaticRegexReplace": ("a regular-expression replace, which no ONNX operator computes", _STANDARDIZE),
    "RegexReplace": ("a regular-expression replace, which no ONNX operator computes", _STANDARDIZE),
    "StaticRegexFullMatch": (
        "a regular-expression match, which ONNX computes from opset 20 on (RegexFullMatch), past the 18 tf2onnx "
        "1.17 writes",
        "the match",
    ),
    "RegexFullMatch": (
        "a regular-expression match, which ONNX computes from opset 20 on (RegexFullMatch), past the 18 tf2onnx "
        "1.17 writes",
        "the match",
    ),
    # TextVectorization's split (on whitespace by default): ONNX's StringSplit came in opset 20.
    "StringSplitV2": (
        "splitting text, which ONNX computes from opset 20 on (StringSplit), past the 18 tf2onnx 1.17 writes",
        "the split (TextVectorization(split=None) on text split into tokens beforehand)",
    ),
    "StringNGrams": ("joining tokens into n-grams, which no ONNX operator does", "the n-grams"),
}


def refuse_inexpressible(nodes, unit_of) -> None:
    """Refuse the ONNX file when one of `nodes` ((name, TF op type) pairs) is an op no ONNX operator
    expresses, naming the op and its unit (`unit_of(node name)`: a layer, a node)."""
    first: dict[str, str] = {}
    for name, op in nodes:
        if op in INEXPRESSIBLE:
            first.setdefault(op, name)
    if not first:
        return
    op = min(first, key=lambda o: (unit_of(first[o]) is None, o))  # one a layer can be named for
    layer = unit_of(first[op])
    where = f"layer '{layer}'" if layer else f"node '{first[op]}'"
    reason, step = INEXPRESSIBLE[op]
    others = sorted(set(first) - {op})
    also = f" (also {', '.join(others)})" if others else ""
    raise NotExportable(
        f"not exportable to ONNX: {where} ({op}): {reason}{also}",
        hint=f"serve the SavedModel (--export savedmodel); compute {step} before the model if ONNX is needed",
    )


def reject_unconverted_ops(proto, unit_of):
    """Refuse ops tf2onnx left unconverted, naming each with its unit (`unit_of(node name)`: a layer, a node)."""
    # process_tf_graph runs with continue_on_error=True, as from_function
    # has it: ops tf2onnx cannot map stay in the graph under their TensorFlow
    # op type, so that all of them can be named here with their layers.
    opsets = {o.domain or "": o.version for o in proto.opset_import}
    first: dict[str, onnx.NodeProto] = {}  # op type -> first node of that type
    for g in graphs(proto.graph):
        for n in g.node:
            if schema(n, opsets.get(n.domain or "", 1)) is None:
                first.setdefault(n.op_type, n)
    if not first:
        return
    refuse_inexpressible(((n.name, op) for op, n in first.items()), unit_of)
    ops = sorted(first, key=lambda op: (op in _CALL_OPS, op))
    blamed = []
    for op in ops:
        layer = unit_of(first[op].name)
        blamed.append(f"{op} (node '{first[op].name}'" + (f" in layer '{layer}')" if layer else ")"))
    layer = unit_of(first[ops[0]].name)
    hint = "use --export savedmodel"
    if layer:
        hint += f", or --keep-float32 {layer} if the op only fails in 16-bit"
    noun = "op" if len(ops) == 1 else "ops"
    raise MpconvertError(f"tf2onnx cannot convert the TensorFlow {noun} {', '.join(blamed)} to ONNX", hint=hint)


def check_inputs(proto, specs):
    # A graph input beyond the model's own (a tensor the trace captured and
    # freezing left as a placeholder) is one that no caller knows to feed.
    got = fed_inputs(proto)
    want = [s.name for s in specs]
    if got != want:
        extra = [n for n in got if n not in want]
        raise MpconvertError(
            f"the ONNX graph's inputs are {got}, not the model's {want}"
            + (f": {extra} came from tensors the model captures" if extra else ""),
            hint="use --export savedmodel",
        )


def check(proto, unit_of):
    """Check the model; returns it serialized. `unit_of(node name)` names what to keep float32 for a bad node.

    Serialized once for the size limit, the checker and the file: upb's
    ByteSize, check_model and onnx.save each serialize the whole model.
    ResNet50's 100 MB: checked and written in 0.5 s instead of 0.8 s.
    """
    try:
        data = proto.SerializeToString()
    except ValueError:  # protobuf's answer past the limit, as onnx.save expects
        data = None
    if data is None or len(data) > PROTOBUF_LIMIT:
        # Weights traced apart stay out of the message (external.py); what is left is constants the trace made.
        raise TooLarge(
            "the ONNX model is over protobuf's 2 GiB limit on one message with its weights kept in external "
            "data: its graph holds that much in constants the model computes, not in its variables",
            hint="use --export savedmodel",
        )
    _checked(data, proto, unit_of)
    return data


def check_file(path, proto, unit_of) -> None:
    """onnx.checker's full check of a written file by its path: its external data is found beside it."""
    _checked(str(path), proto, unit_of)


def _checked(model, proto, unit_of) -> None:
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        msg = first_line(exc, limit=1000)
        layer = next((unit_of(n.name) for n in proto.graph.node if n.name and n.name in msg), None)
        hint = "use --export savedmodel" + (f", or --keep-float32 {layer}" if layer else "")
        raise MpconvertError(f"the converted ONNX graph is invalid: {msg}", hint=hint) from exc
