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
from pathlib import Path
from typing import Any

import numpy as np

from ..artifact_kinds import ArtifactKind
from ..artifacts import (
    OVERHEAD,
    OnnxFile,
    Writer,
    litert_parity,
    onnx_parity,
    parity,
    savedmodel_parity,
)
from ..configs import model_class, model_config
from ..context import Context
from ..emptybatch import guarded, padded
from ..errors import MpconvertError
from ..finetune import Finetune, StepCallback, finetune
from ..formats import ModelFormat
from ..frameworks import Framework
from ..litert import builtin_tables, write_litert
from ..load import Loaded
from ..numerics.autokeep import keep_by_lint, keep_by_search
from ..numerics.lint import Lint
from ..numerics.search import Goal, Search
from ..onnx.checks import layer_of
from ..options import ExportOptions, FinetuneOptions, PadOptions, RewriteOptions
from ..pad import Padding, PadPlan, pad, plan_model_padding
from ..precision import Precision
from ..rewrite import Plan, Rewritten, float32_copy, output_activation, plan_conversion, rewrite, with_sublayers
from ..runners.keras import KerasRunner, input_specs, serving_fn
from ..sections import Source
from ..signature import Signature, signature_of
from ..speed.memory import activation_memory
from ..tasks import Task, TaskKind, padding_of
from ..trace import mask_zero_inputs, output_layers, sublayers
from .base import Capability, ModelKind


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


def tasks_of(model: Any, signature: Signature) -> tuple[Task, ...]:
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


class KerasKind(ModelKind):
    paths = ("keras", "savedmodel")
    lacks: dict[Capability, str] = {}

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

    def runner(self, model: Any, path: str | None = None) -> KerasRunner:
        return KerasRunner(model, self.signature, path or self.paths[0])

    def lint(self, context: Context, options: RewriteOptions) -> tuple[Lint, RewriteOptions]:
        return keep_by_lint(context, self.loaded, options)

    def plan(self, options: RewriteOptions) -> Plan:
        planned = plan_conversion(model_config(self.original), model_class(self.original), options)
        return with_sublayers(planned, sublayers(self.original))

    def rewrite(self, options: RewriteOptions, rows: list[np.ndarray]) -> Rewritten:
        return rewrite(self.original, self.framework, options, rows)

    def search(
        self,
        context: Context,
        candidate: Any,
        options: RewriteOptions,
        goal: Goal,
    ) -> tuple[Search, RewriteOptions]:
        return keep_by_search(context, self.loaded, candidate, options, goal)

    def finetune(
        self, context: Context, model: Any, options: FinetuneOptions, seed: int, on_step: StepCallback | None
    ) -> Finetune:
        return finetune(context, self.loaded, model, options, seed, on_step)

    def pad(self, model: Any, options: PadOptions, rows: list[np.ndarray], precision: Precision) -> Padding:
        return pad(model, self.framework, options, rows, precision)

    def padding_plan(self, model: Any, options: PadOptions) -> PadPlan:
        return plan_model_padding(model, self.framework, options)

    def activation_memory(self, model: Any, batch: int, inputs: list[Any]) -> dict | None:
        return activation_memory(self.original, model, batch, inputs=inputs, signature=self.signature)

    def writers(
        self, model: Any, rows: list[np.ndarray], expected: list[np.ndarray], out: Path, options: ExportOptions
    ) -> list[Writer]:
        signature = self.signature
        writers: list[Writer] = []
        if ArtifactKind.SAVEDMODEL in options.kinds:

            def savedmodel(path: Path):
                write_savedmodel(model, self.framework, signature, path)
                written = savedmodel_parity(path, signature, rows, expected)
                if not self.framework.is_keras3:
                    _check_tf_keras_policies_survive(self.framework, path, model)
                return written

            writers.append((ArtifactKind.SAVEDMODEL, out / "savedmodel", savedmodel))
            if self.framework.is_keras3:

                def keras_file(path: Path):
                    model.save(str(path))
                    reloaded = self.framework.module.models.load_model(str(path), compile=False)
                    # The file training resumes from, not a serving artifact: no batch-size check (Keras's
                    # own eager and predict paths fail on an empty batch of a 16-bit model under oneDNN).
                    got = KerasRunner(reloaded, signature).run(rows).outputs
                    return parity(ArtifactKind.KERAS, path, expected, got, "keras", {}, signature)

                writers.append((ArtifactKind.KERAS, out / "model.keras", keras_file))
        if ArtifactKind.ONNX in options.kinds:
            writers.append(
                (
                    ArtifactKind.ONNX,
                    out / "model.onnx",
                    lambda path: onnx_parity(
                        self.onnx(model, path, options.opset, options.onnx_io, options.onnx_external_data),
                        rows,
                        expected,
                        signature,
                    ),
                )
            )
        if ArtifactKind.LITERT in options.kinds:

            def litert_file(path: Path):
                try:
                    float32 = float32_copy(model, self.framework, [x[:2] for x in rows], unroll=True)
                except Exception as exc:  # Keras refuses to unroll a sequence of unknown length
                    raise MpconvertError(
                        f"the model cannot be rebuilt for LiteRT: {type(exc).__name__}: {str(exc)[:200]}",
                        hint="give recurrent layers a fixed sequence length, or --export savedmodel,onnx",
                    ) from None
                tables = builtin_tables(float32)
                with tempfile.TemporaryDirectory(prefix="mpconvert-litert-") as tmp:
                    write_savedmodel(float32, self.framework, signature, Path(tmp) / "float32", empty="pad")
                    written = write_litert(
                        Path(tmp) / "float32", path, unit_of=lambda n: layer_of(n, float32), tables=tables
                    )
                return litert_parity(written, rows, expected, signature)

            writers.append((ArtifactKind.LITERT, out / "model.tflite", litert_file))
        return writers

    def onnx(
        self, model: Any, path: Path, opset: int, io: str = "float32", external_data: int | None = None
    ) -> OnnxFile:
        from ..onnx.export import keras_to_onnx

        over = {} if external_data is None else {"external_data_over": external_data}
        exported = keras_to_onnx(model, input_specs(self.signature), path, opset=opset, io=io, **over)
        names = tuple(spec.name for spec in self.signature.inputs)
        return OnnxFile(exported, names, tuple(spec.name for spec in self.signature.outputs))

    def output_bytes(self, model: Any, kinds: Sequence[str]) -> int:
        """The weights once per file that holds them: a SavedModel and a .keras file keep float32
        variables, the ONNX file 16-bit weights (half)."""
        weights = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
        copies = 0.0
        if "savedmodel" in kinds:
            copies += 2.0 if self.framework.is_keras3 else 1.0  # the SavedModel, and model.keras beside it
        if "onnx" in kinds:
            copies += 0.5
        return int(weights * copies) + OVERHEAD


def write_savedmodel(model: Any, framework: Framework, signature: Signature, path: Path, empty: str = "branch") -> None:
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


def track_once(archive: Any, model: Any) -> None:
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


def _check_tf_keras_policies_survive(framework: Framework, path: Path, model: Any) -> None:
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


def refuse_string_outputs(model: Any, signature: Signature) -> None:
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
