"""The Keras kind: a Keras 3 or tf-keras model, whose units are layers.

Everything a conversion does to a Keras model goes through here: the
per-layer plan and the rebuild from the model's config (rewrite.py), the
numeric lint and the accuracy-driven search over layers (numerics/),
fine-tuning with loss scaling (finetune.py), Tensor-Core padding (pad/),
activation memory from layer shapes, and the artifacts a Keras model
exports (a SavedModel, a .keras file beside it for Keras 3, an ONNX file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from mpconvert.data.context import Context
from mpconvert.data.formats import ModelFormat
from mpconvert.data.signature import Signature, signature_of
from mpconvert.data.tasks import Task, TaskKind, padding_of
from mpconvert.export.artifacts import OVERHEAD
from mpconvert.export.formats.base import LiteRTFile, OnnxFile
from mpconvert.export.formats.litert import builtin_tables, write_litert
from mpconvert.export.serving import guarded, padded
from mpconvert.keras.activation_memory import activation_memory
from mpconvert.keras.autokeep import keep_by_lint, keep_by_search
from mpconvert.keras.configs import model_class, model_config
from mpconvert.keras.finetune import Finetune, StepCallback, finetune
from mpconvert.keras.frameworks import Framework
from mpconvert.keras.lint import Lint
from mpconvert.keras.load import Loaded
from mpconvert.keras.pad import Padding, PadPlan, pad, plan_model_padding
from mpconvert.keras.rewrite import (
    Plan,
    Rewritten,
    float32_copy,
    output_activation,
    plan_conversion,
    rewrite,
    with_sublayers,
)
from mpconvert.keras.trace import mask_zero_inputs, output_layers, sublayers
from mpconvert.kinds.base import ModelKind
from mpconvert.numerics.search import Goal, Search
from mpconvert.onnx.graph_checks import layer_of
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.options.export import ExportOptions
from mpconvert.options.finetune import FinetuneOptions
from mpconvert.options.pad import PadOptions
from mpconvert.options.precision import Precision
from mpconvert.options.rewrite import RewriteOptions
from mpconvert.report.sections import Source
from mpconvert.report.sections.speed import ActivationMemory
from mpconvert.runners.keras import KerasRunner, input_specs, serving_fn
from mpconvert.runners.savedmodel import DEFAULT_SIGNATURE
from mpconvert.system.errors import MpconvertError

# A Keras 3 or tf-keras model: neither ships type information, so the kind's model type is Any, by name.
KerasModel: TypeAlias = Any


def _kind(activation: str | None) -> TaskKind:
    if activation in ("softmax", "log_softmax"):
        return TaskKind.SOFTMAX
    return TaskKind.SIGMOID if activation == "sigmoid" else TaskKind.REGRESSION


def _activation_of(layer: Any) -> str | None:
    if layer is None:
        return None
    if type(layer).__name__ == "Softmax":
        return "softmax"
    activation = getattr(layer, "activation", None)  # a function on a live layer
    return activation if isinstance(activation, str) else getattr(activation, "__name__", None)


def tasks_of(model: KerasModel, signature: Signature) -> tuple[Task, ...]:
    """What each output means (softmax, sigmoid or regression), in the signature's order, and a sequence
    output's padding input (tasks.padding_of)."""
    if len(signature.outputs) == 1:
        activations = [output_activation(model_config(model), model_class(model))]
    else:
        activations = [_activation_of(layer) for layer in output_layers(model)]
    zero_masked = mask_zero_inputs(model)
    return tuple(
        Task(
            _kind(activation),
            spec,
            logits=activation == "log_softmax",
            padding=padding_of(spec, signature.inputs, signature.input_keys, zero_masked),
        )
        for activation, spec in zip(activations, signature.outputs)
    )


@dataclass(frozen=True)
class KerasFinetuner:
    """Fine-tuning with loss scaling where the policy needs it (finetune.py)."""

    loaded: Loaded

    def finetune(
        self, context: Context, model: KerasModel, options: FinetuneOptions, seed: int, on_step: StepCallback | None
    ) -> Finetune:
        return finetune(context, self.loaded, model, options, seed, on_step)


@dataclass(frozen=True)
class KerasPadder:
    """Tensor-Core padding of layer widths (pad/), with its equivalence proof."""

    framework: Framework

    def pad(self, model: KerasModel, options: PadOptions, rows: list[np.ndarray], precision: Precision) -> Padding:
        return pad(model, self.framework, options, rows, precision)

    def plan(self, model: KerasModel, options: PadOptions) -> PadPlan:
        return plan_model_padding(model, self.framework, options)


@dataclass(frozen=True)
class LayerMemory:
    """Activation memory: measured on a GPU, else computed from every layer's output shape (activation_memory.py)."""

    original: KerasModel
    signature: Signature

    def measure(self, model: KerasModel, batch: int, rows: list[np.ndarray]) -> ActivationMemory | None:
        return activation_memory(self.original, model, batch, inputs=rows, signature=self.signature)


@dataclass(frozen=True)
class LayerPlanner:
    """`mpconvert inspect`'s per-layer plan, read from the model's config (nothing built)."""

    original: KerasModel

    def plan(self, options: RewriteOptions) -> Plan:
        planned = plan_conversion(model_config(self.original), model_class(self.original), options)
        return with_sublayers(planned, sublayers(self.original))


class KerasKind(ModelKind[KerasModel, Rewritten]):
    paths = ("keras", "savedmodel")

    def __init__(self, loaded: Loaded):
        self.loaded = loaded
        self.format = ModelFormat(loaded.format)
        self.original = loaded.model
        self.signature = signature_of(loaded.model)
        refuse_string_outputs(loaded.model, self.signature)
        self.tasks = tasks_of(loaded.model, self.signature)

    @property
    def framework(self) -> Framework:
        return self.loaded.framework

    def finetuner(self) -> KerasFinetuner:
        return KerasFinetuner(self.loaded)

    def padder(self) -> KerasPadder:
        return KerasPadder(self.framework)

    def activation_memory_meter(self) -> LayerMemory:
        return LayerMemory(self.original, self.signature)

    def inspector(self) -> LayerPlanner:
        return LayerPlanner(self.original)

    def release(self) -> None:
        # TensorFlow's oneDNN CPU allocator keeps what it freed for its own next tensors (its resident
        # memory never shrinks), so the original's weights are worth freeing only before other weights
        # load: the SavedModel's and model.keras's re-checks then reuse them instead of growing the process.
        self.original = None
        self.loaded = dataclasses.replace(self.loaded, model=None)
        gc.collect()  # a Keras model is a cycle of references: freed by a collection, not when let go

    def describe(self, path: Path | None) -> Source:
        return self.loaded.source(path)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        with self.framework.preserved_global_policy(), self.loaded.deserialization():
            yield

    def runner(self, model: KerasModel, path: str | None = None) -> KerasRunner:
        return KerasRunner(model, self.signature, path or self.paths[0])

    def lint(self, context: Context, options: RewriteOptions) -> tuple[Lint, RewriteOptions]:
        return keep_by_lint(context, self.loaded, options)

    def rewrite(self, options: RewriteOptions, rows: list[np.ndarray]) -> Rewritten:
        return rewrite(self.original, self.framework, options, rows)

    def search(
        self,
        context: Context,
        candidate: Rewritten,
        options: RewriteOptions,
        goal: Goal,
    ) -> tuple[Search, RewriteOptions]:
        return keep_by_search(context, self.loaded, candidate, options, goal)

    def writes(self, model: KerasModel, rows: list[np.ndarray]) -> KerasWrites:
        return KerasWrites(self, model, rows)

    def onnx(
        self, model: KerasModel, path: Path, opset: int, io: str = "float32", external_data: int | None = None
    ) -> OnnxFile:
        from mpconvert.onnx.export import keras_to_onnx

        over = {} if external_data is None else {"external_data_over": external_data}
        exported = keras_to_onnx(
            model, input_specs(self.signature), path, opset=opset, io=io, keras3=self.framework.is_keras3, **over
        )
        names = tuple(spec.name for spec in self.signature.inputs)
        return OnnxFile(exported, names, tuple(spec.name for spec in self.signature.outputs))

    def output_bytes(self, model: KerasModel, kinds: Sequence[str]) -> int:
        """The weights once per file that holds them: a SavedModel and a .keras file keep float32
        variables, the ONNX file and the OpenVINO IR 16-bit weights (half)."""
        weights = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
        copies = 0.0
        if "savedmodel" in kinds:
            copies += 2.0 if self.framework.is_keras3 else 1.0  # the SavedModel, and model.keras beside it
        if "onnx" in kinds:
            copies += 0.5
        if "openvino" in kinds:  # float16 weights (compress_to_fp16)
            copies += 0.5
        return int(weights * copies) + OVERHEAD


@dataclass(frozen=True)
class KerasWrites:
    """How a Keras model is written in each format (export/formats/)."""

    kind: KerasKind
    model: KerasModel
    rows: list[np.ndarray]

    @property
    def signature(self) -> Signature:
        return self.kind.signature

    @property
    def kinds(self) -> frozenset[str]:
        # model.keras is Keras 3's format: a tf-keras model's SavedModel reloads as the Keras model instead.
        every = frozenset(ArtifactKind)
        return every if self.kind.framework.is_keras3 else every - {ArtifactKind.KERAS}

    def savedmodel(self, path: Path) -> str:
        framework = self.kind.framework
        write_savedmodel(self.model, framework, self.signature, path)
        if not framework.is_keras3:
            _check_tf_keras_policies_survive(framework, path, self.model)
        return DEFAULT_SIGNATURE

    def keras(self, path: Path) -> None:
        self.model.save(str(path))

    def onnx(self, path: Path, options: ExportOptions) -> OnnxFile:
        return self.kind.onnx(self.model, path, options.opset, options.onnx_io, options.onnx_external_data)

    def litert(self, path: Path) -> LiteRTFile:
        framework = self.kind.framework
        try:
            float32 = float32_copy(self.model, framework, [x[:2] for x in self.rows], unroll=True)
        except Exception as exc:  # Keras refuses to unroll a sequence of unknown length
            raise MpconvertError(
                f"the model cannot be rebuilt for LiteRT: {type(exc).__name__}: {str(exc)[:200]}",
                hint="give recurrent layers a fixed sequence length, or --export savedmodel,onnx",
            ) from None
        tables = builtin_tables(float32)
        with tempfile.TemporaryDirectory(prefix="mpconvert-litert-") as tmp:
            write_savedmodel(float32, framework, self.signature, Path(tmp) / "float32", empty="pad")
            return write_litert(Path(tmp) / "float32", path, unit_of=lambda n: layer_of(n, float32), tables=tables)


def write_savedmodel(
    model: KerasModel, framework: Framework, signature: Signature, path: Path, empty: str = "branch"
) -> None:
    """`empty`: how the serving signature takes an empty request (emptybatch.py): "branch" answers it
    without running 16-bit kernels that fail on it; "pad" runs it on one row of zeros, for LiteRT."""
    serve = serving_fn(model, signature)
    if empty == "pad":
        serve = padded(serve)
    else:
        serve = guarded(serve, [spec.name for spec in signature.outputs], signature.outputs)
    if framework.is_keras3:
        archive = framework.module.export.ExportArchive()
        track_once(archive, model)
        archive.add_endpoint("serve", serve, input_signature=input_specs(signature))
        archive.write_out(str(path), verbose=False)
    else:
        import tensorflow as tf

        # A Keras-2 SavedModel written by tf-keras reloads as a Keras model
        # with its per-layer policies (tf_keras.models.load_model).
        function = tf.function(serve, input_signature=input_specs(signature), autograph=False)
        signatures = {"serving_default": function.get_concrete_function()}
        model.save(str(path), save_format="tf", include_optimizer=False, signatures=signatures)


def track_once(archive: Any, model: KerasModel) -> None:
    """`archive.track(model)`, with each weight written once.

    Keras 3.15's `track` lists the model's Keras variables, and the endpoint
    captures the TensorFlow variables inside them: two objects per weight,
    both saved (keras-team/keras#23553), so the SavedModel held every weight
    twice and its re-check restored two copies (a 0.6 GB Dense stack wrote
    1.18 GB of variables). Here the archive tracks the model through a
    holder, which finds its lookup tables as `track` does without listing
    its variables, and the variable lists get the TensorFlow variables
    themselves, which the endpoint's capture then shares.
    """
    import tensorflow as tf

    holder = tf.Module()
    holder.model = model
    archive.track(holder)
    for listed, variables in (
        (archive.variables, model.variables),
        (archive.trainable_variables, model.trainable_variables),
        (archive.non_trainable_variables, model.non_trainable_variables),
    ):
        listed.extend(v.value for v in variables)


def _check_tf_keras_policies_survive(framework: Framework, path: Path, model: KerasModel) -> None:
    """A tf-keras SavedModel must reload as the same Keras model, per-layer policies included.

    Nothing the user gave can break this, so a difference is mpconvert's bug
    (reported as such by the CLI), not an MpconvertError.
    """
    reloaded = framework.module.models.load_model(str(path), compile=False)
    before = [(layer.name, layer.dtype_policy.name) for layer in model.layers]
    after = [(layer.name, layer.dtype_policy.name) for layer in reloaded.layers]
    if before != after:
        changed = [f"{b[0]}: {b[1]} -> {a[1]}" for b, a in zip(before, after) if b != a]
        raise RuntimeError(
            f"the exported SavedModel at {path} reloads with other layer policies ({', '.join(changed[:3])})"
        )


def refuse_string_outputs(model: KerasModel, signature: Signature) -> None:
    """A model that returns text (StringLookup(invert=True)) is refused, naming the output and its layer.

    Validation, the gate and every artifact's parity compare outputs as
    numbers; text has nothing to compute in 16 bits, so the ids before it
    are what a conversion can check.
    """
    layers = output_layers(model)
    layers += [None] * (len(signature.outputs) - len(layers))
    # Keras 3.15 declares an inverted StringLookup's output int64 (it returns text), so its layer tells.
    strings = [
        i
        for i, (spec, layer) in enumerate(zip(signature.outputs, layers))
        if spec.dtype == "string" or (type(layer).__name__ == "StringLookup" and getattr(layer, "invert", False))
    ]
    if not strings:
        return
    spec, layer = signature.outputs[strings[0]], layers[strings[0]]
    made = f", made by {layer.name!r} ({type(layer).__name__})" if layer is not None else ""
    raise MpconvertError(
        f"output {spec.name!r} is a string tensor{made}: mpconvert validates and compares numeric outputs",
        hint="convert the model that returns the ids (or scores) before the text, and map them to text after it",
    )
