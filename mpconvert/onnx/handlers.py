"""mpconvert's own tf2onnx handlers: TensorFlow ops Keras models use that tf2onnx 1.17 lacks or maps too narrowly.

Registered on tf2onnx's process-wide handler table by export.py before each
conversion (under its lock): Erfc (exact GELU), and the ops behind Keras's
preprocessing layers: Bucketize (Discretization), DenseBincount
(CategoryEncoding), LookupTableFindV2 (IntegerLookup, StringLookup) and
Equal on strings (a lookup's mask token).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

# ai.onnx.ml's LabelEncoder maps int64 keys to int64 values from its version 2 on.
ML_DOMAIN, ML_OPSET = "ai.onnx.ml", 2


def register_tf2onnx_handlers():
    """Teach tf2onnx the TF ops it lacks that Keras models use.

    Erfc only where tf2onnx has no handler, so a release that adds one keeps
    its own. Bucketize (which tf2onnx 1.17 lacks) and LookupTableFindV2
    (whose handler maps only string<->int64 tables, and needs their contents
    from a SavedModel) always: the preprocessing layers' ops.
    """
    from tf2onnx import onnx_opset, utils  # noqa: F401 (onnx_opset: its handlers registered first, ours after)
    from tf2onnx.handler import tf_op

    known = {name for opsets in tf_op.get_opsets().values() for table in opsets for name in table}
    if "Erfc" not in known:
        # Keras's exact GELU is 0.5 * x * erfc(-x / sqrt(2)) (ConvNeXt).
        # Where erfc is tiny, 1 - erf(x) keeps only erf's absolute precision
        # (2^-11 in float16, 2^-8 in bfloat16); GELU multiplies it by x/2 in
        # its negative tail, whose outputs are near 0 either way.
        @tf_op("Erfc")
        class _Erfc:
            @classmethod
            def version_13(cls, ctx, node, **kwargs):
                # opset 13: the first with Erf and Sub for bfloat16.
                dtype = ctx.get_dtype(node.input[0])
                one = ctx.make_const(
                    utils.make_name(node.name + "/one"), np.array(1, dtype=utils.map_onnx_to_numpy_type(dtype))
                )
                erf = ctx.make_node(
                    "Erf",
                    [node.input[0]],
                    op_name_scope=node.name,
                    shapes=[ctx.get_shape(node.input[0])],
                    dtypes=[dtype],
                )
                ctx.replace_inputs(node, [one.output[0], erf.output[0]])
                node.type = "Sub"

    # Equal on strings: ONNX's Equal takes strings only from opset 19 on, past the 18 tf2onnx 1.17 writes,
    # and tf2onnx casts them to int32 before it ("stoll" in ONNX Runtime). A lookup layer's mask
    # (StringLookup(mask_token="")) compares its input with one string: an ai.onnx.ml LabelEncoder of that key.
    opsets = tf_op.get_opsets()[""]
    current = opsets[11].get("Equal", (None, None))[0]
    numeric = getattr(current, "numeric", current)  # tf2onnx's own, also when ours was registered before

    @tf_op(["Equal", "NotEqual"])
    class _Equal:
        @classmethod
        def version_11(cls, ctx, node, **kwargs):
            if ctx.get_dtype(node.input[0]) != TensorProto.STRING:
                numeric(ctx, node, **kwargs)
                return
            const = [i for i, x in enumerate(node.inputs) if x.is_const()]
            utils.make_sure(len(const) == 1, "%s of two computed strings has no ONNX operator", node.name)
            key = np.asarray(node.inputs[const[0]].get_tensor_value(as_list=False)).ravel()
            utils.make_sure(key.size == 1, "%s against several strings is not supported", node.name)
            utils.make_sure(
                any(o.domain == ML_DOMAIN for o in ctx.extra_opset or []), "%s of strings needs ai.onnx.ml", node.name
            )
            word = key[0].decode() if isinstance(key[0], bytes) else str(key[0])
            negate = node.type == "NotEqual"
            x = node.input[1 - const[0]]
            found = ctx.make_node(
                "LabelEncoder",
                [x],
                attr={"keys_strings": [word], "values_int64s": [0 if negate else 1], "default_int64": int(negate)},
                domain=ML_DOMAIN,
                op_name_scope=node.name,
                shapes=[ctx.get_shape(x)],
                dtypes=[TensorProto.INT64],
            )
            _replace(ctx, node, "Cast", [found.output[0]], attr={"to": TensorProto.BOOL})

    _Equal.version_11.__func__.numeric = numeric  # type: ignore[attr-defined]

    # Keras's preprocessing layers (mpconvert owns these mappings; tf2onnx 1.17 has none for Bucketize and
    # maps only string<->int64 tables, through CategoryMapper).
    @tf_op("Bucketize")
    class _Bucketize:
        @classmethod
        def version_13(cls, ctx, node, **kwargs):
            # Discretization: the bucket of x is how many boundaries are <= x (TF's rule: [b_i-1, b_i)).
            boundaries = np.array(node.get_attr_value("boundaries"), dtype=np.float32)
            x = node.input[0]
            if ctx.get_dtype(x) != TensorProto.FLOAT:
                x = ctx.make_node("Cast", [x], attr={"to": TensorProto.FLOAT}, op_name_scope=node.name).output[0]
            axes = ctx.make_const(utils.make_name(node.name + "/axes"), np.array([-1], dtype=np.int64))
            expanded = ctx.make_node("Unsqueeze", [x, axes.output[0]], op_name_scope=node.name).output[0]
            bounds = ctx.make_const(utils.make_name(node.name + "/boundaries"), boundaries)
            at_or_above = ctx.make_node("GreaterOrEqual", [expanded, bounds.output[0]], op_name_scope=node.name)
            counted = ctx.make_node(
                "Cast", [at_or_above.output[0]], attr={"to": TensorProto.INT32}, op_name_scope=node.name
            )
            _replace(ctx, node, "ReduceSum", [counted.output[0], axes.output[0]], attr={"keepdims": 0})

    @tf_op("DenseBincount")
    class _DenseBincount:
        @classmethod
        def version_13(cls, ctx, node, **kwargs):
            # CategoryEncoding's multi_hot and count: counts of each id per row, for an input of any rank
            # (tf2onnx's own handler needs the rank known, and a lookup's output has none in TensorFlow).
            values, size, weights = node.input
            utils.make_sure(
                0 in (ctx.get_shape(weights) or [0]), "DenseBincount %s with weights is not supported", node.name
            )
            ids = ctx.make_node("Cast", [values], attr={"to": TensorProto.INT64}, op_name_scope=node.name)
            depth = ctx.make_node("Cast", [size], attr={"to": TensorProto.INT64}, op_name_scope=node.name)
            off_on = ctx.make_const(utils.make_name(node.name + "/off_on"), np.array([0, 1], dtype=np.int64))
            hot = ctx.make_node(
                "OneHot", [ids.output[0], depth.output[0], off_on.output[0]], attr={"axis": -1}, op_name_scope=node.name
            )
            axes = ctx.make_const(utils.make_name(node.name + "/axes"), np.array([-2], dtype=np.int64))
            binary = node.get_attr_value("binary_output", False)
            # ReduceMax takes its axes as an input from opset 18 on; ReduceSum from 13.
            reduced = ctx.make_node(
                "ReduceSum", [hot.output[0], axes.output[0]], attr={"keepdims": 0}, op_name_scope=node.name
            )
            counted = reduced.output[0]
            if binary:
                one = ctx.make_const(utils.make_name(node.name + "/one"), np.array(1, dtype=np.int64))
                counted = ctx.make_node("Min", [counted, one.output[0]], op_name_scope=node.name).output[0]
            _replace(ctx, node, "Cast", [counted], attr={"to": node.output_dtypes[0]})

    @tf_op("LookupTableFindV2")
    class _LookupTableFind:
        @classmethod
        def version_13(cls, ctx, node, initialized_tables=None, **kwargs):
            # IntegerLookup (int64 -> int64) and StringLookup (string -> int64): ai.onnx.ml LabelEncoder
            # with the table's keys and values and the lookup's default (the out-of-vocabulary index).
            table = node.inputs[0]
            while table.type == "Identity":
                table = table.inputs[0]
            shared = table.get_attr_value("shared_name")
            utils.make_sure(
                shared in (initialized_tables or {}),
                "the contents of table %s (node %s) are unknown",
                shared,
                node.name,
            )
            keys, values = initialized_tables[shared]
            default = node.inputs[2]
            utils.make_sure(default.is_const(), "the default of table lookup %s is not a constant", node.name)
            default_value = default.get_tensor_value()
            keys, values = np.asarray(keys), np.asarray(values)
            utils.make_sure(values.dtype.kind == "i", "lookup %s maps to %s, not integers", node.name, values.dtype)
            attr = {"values_int64s": [int(v) for v in values], "default_int64": int(default_value)}
            if keys.dtype.kind in ("S", "U", "O"):
                attr["keys_strings"] = [k.decode() if isinstance(k, bytes) else str(k) for k in keys]
            else:
                attr["keys_int64s"] = [int(k) for k in keys]
            # Elementwise: the keys' shape (TensorFlow leaves a table lookup's output shape unknown).
            shape = ctx.get_shape(node.input[1])
            _replace(ctx, node, "LabelEncoder", [node.input[1]], attr=attr, domain=ML_DOMAIN, shapes=[shape])
            if not ctx.find_output_consumers(table.output[0]):
                ctx.remove_node(table.name)
            # A lookup with a mask token (mask_token=0 or "") puts the mask's id back with a SelectV2 of a
            # scalar and the lookup. tf2onnx 1.17's shape inference gives a SelectV2 whose one branch has no
            # shape the other branch's shape, the scalar's [] (a rule for Select, whose branches share a shape),
            # and onnx.checker refuses the Add it becomes ("differ in rank: (2) vs (0)"). With the lookup's
            # shape known here, before the SelectV2 is converted, its output gets the broadcast shape.
            for consumer in ctx.find_output_consumers(node.output[0]):
                if consumer.type == "SelectV2":
                    shapes = [ctx.get_shape(name) for name in consumer.input]
                    if all(shape is not None for shape in shapes):
                        _reshape_through_identities(ctx, consumer.output[0], _broadcast(shapes))


def _replace(ctx, node, op_type: str, inputs: list[str], shapes: list | None = None, **kwargs):
    """`node` replaced by one `op_type` node of its name and outputs, so that its consumers read the new one;
    `shapes`: the outputs' shapes where TensorFlow left them unknown."""
    shapes, dtypes = shapes or node.output_shapes, node.output_dtypes
    ctx.remove_node(node.name)
    return ctx.make_node(op_type, inputs, name=node.name, outputs=node.output, shapes=shapes, dtypes=dtypes, **kwargs)


def _broadcast(shapes: list[list[int]]) -> list[int]:
    """NumPy's broadcast of shapes in tf2onnx's form (-1 for an unknown dimension)."""
    rank = max(len(shape) for shape in shapes)
    out = []
    for dims in zip(*([1] * (rank - len(shape)) + list(shape) for shape in shapes)):
        known = {d for d in dims if d not in (1, -1)}
        out.append(known.pop() if len(known) == 1 else (1 if all(d == 1 for d in dims) else -1))
    return out


def _reshape_through_identities(ctx, name: str, shape: list[int]) -> None:
    """Give tensor `name` `shape`, and the Identity chain after it (up to the graph output) the same."""
    ctx.set_shape(name, shape)
    for consumer in ctx.find_output_consumers(name):
        if consumer.type == "Identity":
            _reshape_through_identities(ctx, consumer.output[0], shape)
