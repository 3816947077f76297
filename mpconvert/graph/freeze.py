"""A SavedModel without Keras layers, as a frozen graph mpconvert can rewrite, run and save again.

Keras 3's `model.export()`, `tf.saved_model.save` of a tf.Module or a
tf.function, TF Hub and TF Serving models carry no keras_metadata.pb: there
are no layers and no dtype policies, only graphs. One serving signature
(`serving_default`, or --signature) is frozen (its variables become
constants, `convert_variables_to_constants_v2`) into a GraphDef; the
rewrite changes that GraphDef's op dtypes; this module runs a GraphDef
(imported into a wrapped function) and writes it back as a SavedModel with
the same signature name, input and output names and dtypes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mpconvert.data.signature import Signature, TensorSpec
from mpconvert.export.serving import guarded, padded
from mpconvert.runners.base import as_float32
from mpconvert.runners.graph import GraphRunner
from mpconvert.runners.savedmodel import SignatureRunner
from mpconvert.system.errors import MpconvertError
from mpconvert.system.versions import newer_version

DEFAULT_SIGNATURE = "serving_default"


@dataclass(frozen=True)
class FrozenGraph:
    """One frozen serving signature: its GraphDef and what its inputs and outputs are called."""

    name: str
    graph_def: Any  # tf.compat.v1.GraphDef
    signature_name: str
    inputs: tuple[TensorSpec, ...]  # named like the signature's keyword arguments
    input_tensors: tuple[str, ...]  # "name:0" in graph_def, in `inputs` order
    outputs: tuple[TensorSpec, ...]  # named like the signature's output keys
    output_tensors: tuple[str, ...]
    # The loaded signature itself, which the frozen graph must reproduce (None after a rewrite).
    source: Any = field(default=None, compare=False, repr=False)

    @property
    def signature(self) -> Signature:
        return Signature(self.inputs, self.outputs)

    def with_graph(self, graph_def: Any) -> FrozenGraph:
        return replace(self, graph_def=graph_def, source=None)

    @functools.cached_property
    def runner(self) -> GraphRunner:
        """Runs the graph in memory (the serving function imported once per FrozenGraph)."""
        return GraphRunner(self.graph_def, self.input_tensors, self.output_tensors, self.output_names)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.outputs)

    def predict(self, inputs: list[np.ndarray] | tuple[np.ndarray, ...], tensors: tuple[str, ...] | None = None):
        """The outputs (or `tensors`, "node:0") on every row, as float32 arrays."""
        return self.runner.run(inputs, tensors).outputs

    def signature_outputs(self, rows: list[np.ndarray]) -> list[np.ndarray]:
        """The loaded SavedModel's own signature on `rows`: what the frozen graph must reproduce."""
        return as_float32(SignatureRunner(self.source, self.signature).run(rows).outputs)

    def save(self, path: Path, empty: str = "branch") -> None:
        """A SavedModel whose `signature_name` takes and returns what the original's did, by name.

        An empty request gets empty outputs without running the graph (emptybatch.py); with
        `empty="pad"` (for the LiteRT converter, which cannot take that branch) it runs on one row of zeros.
        """
        import tensorflow as tf

        module = tf.Module()
        module.graph = self.runner.serving
        names = [spec.name for spec in self.inputs]
        keys = [spec.name for spec in self.outputs]
        specs = [tf.TensorSpec(spec.shape, spec.dtype, name=spec.name) for spec in self.inputs]

        def serve(*args):
            return dict(zip(keys, module.graph(*args)))

        if all(spec.shape[:1] == (None,) for spec in self.inputs):
            serve = padded(serve) if empty == "pad" else guarded(serve, keys, self.outputs)

        # The signature's keyword names are the arguments' names: give the function those.
        serve.__signature__ = _named_signature(names)  # type: ignore[attr-defined]
        module.serve = tf.function(serve, input_signature=specs, autograph=False)
        tf.saved_model.save(module, str(path), signatures={self.signature_name: module.serve})


def _named_signature(names: list[str]):
    import inspect

    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    return inspect.Signature(params)


def saved_tensorflow_version(path: Path) -> str | None:
    """The TensorFlow version saved_model.pb says wrote it; None where it says none. Never raises."""
    from tensorflow.core.protobuf import saved_model_pb2

    try:
        saved = saved_model_pb2.SavedModel()
        saved.ParseFromString((Path(path) / "saved_model.pb").read_bytes())
        version = saved.meta_graphs[0].meta_info_def.tensorflow_version
    except Exception:  # a damaged file: the failure being explained says so already
        return None
    return version or None


def load_frozen(path: Path, signature_name: str | None = None) -> FrozenGraph:
    """The SavedModel's serving signature, frozen; a clear error for a file TensorFlow cannot load."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:  # TensorFlow's own errors for damaged protos, missing variables
        failure = f"cannot load SavedModel {path}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        saved = saved_tensorflow_version(path)
        if saved is not None and newer_version(saved, tf.__version__):
            # A newer TensorFlow writes ops this one has no kernel for ("Op type not registered").
            wanted = ".".join(saved.split(".")[:2])
            raise MpconvertError(
                f"SavedModel {path} was saved by TensorFlow {saved}, and this is TensorFlow {tf.__version__}: "
                + failure,
                hint=f"load it with TensorFlow {wanted} or newer (pip install -U 'tensorflow>={wanted}'), "
                f"or export the model again with TensorFlow {tf.__version__}",
            ) from None
        raise MpconvertError(
            failure, hint="check that the folder is a complete SavedModel (saved_model.pb and variables/)"
        ) from None
    found = sorted(loaded.signatures)
    wanted = signature_name or DEFAULT_SIGNATURE
    if wanted not in loaded.signatures:
        named = f"its signatures are {', '.join(found)}" if found else "it has no signatures at all"
        raise MpconvertError(
            f"SavedModel {path} has no signature {wanted!r}: {named}",
            hint=f"pass --signature {found[0]}"
            if found
            else "save the model with a serving signature "
            "(tf.saved_model.save(module, path, signatures=...) or Keras model.export(path))",
        )
    fn = loaded.signatures[wanted]
    _, kwargs = fn.structured_input_signature
    frozen = convert_variables_to_constants_v2(fn)
    # Sorted, as the frozen function's inputs are (its flattened keyword
    # order): a loaded signature's keywords come from a protobuf map, whose
    # order changes from one process to the next, and the signature's order
    # is the one the report, the artifacts and a list of inputs follow.
    names = sorted(kwargs)
    placeholders = [t for t in frozen.inputs if t.dtype != tf.resource]
    by_key = dict(zip(names, placeholders))
    inputs = tuple(TensorSpec(n, tuple(kwargs[n].shape), kwargs[n].dtype.name) for n in names)
    bad = [spec for spec in inputs if spec.dtype == "string"]
    if bad:
        raise MpconvertError(
            f"SavedModel {path} takes a string input {bad[0].name!r}: mixed precision has nothing to convert there",
            hint="convert the model behind its text preprocessing",
        )
    structured = fn.structured_outputs
    keys = sorted(structured)
    outputs = tuple(TensorSpec(k, tuple(structured[k].shape), structured[k].dtype.name) for k in keys)
    out_tensors = dict(zip(sorted(structured), frozen.outputs))
    return FrozenGraph(
        source=fn,
        name=Path(path).name,
        graph_def=frozen.graph.as_graph_def(),
        signature_name=wanted,
        inputs=inputs,
        input_tensors=tuple(by_key[n].name for n in names),
        outputs=outputs,
        output_tensors=tuple(out_tensors[k].name for k in keys),
    )
