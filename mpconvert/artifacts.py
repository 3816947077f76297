"""Write the converted model's artifacts, then re-load and re-run every one.

An artifact is only reported once it has been read back and its outputs
compared with the converted Keras model on real inputs: a file that was
written but does not load is a failure, not a success.

One artifact failing (an MpconvertError: tf2onnx cannot convert an op, the
graph is invalid) does not throw the others away: it is reported as failed
with the reason, and the gate's parity check for it fails (exit code 3).
Any other exception is mpconvert's bug and propagates.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import MpconvertError, WriteError
from .frameworks import Framework
from .options import ExportOptions
from .signature import Signature, output_list
from .validate import max_abs_diff, predict
from .writing import writing


@dataclass(frozen=True)
class Artifact:
    kind: str  # "savedmodel", "keras" or "onnx"
    path: str | None  # relative to the output folder; None when it failed
    bytes: int
    max_abs_diff: float | None
    # Largest |output| of the converted Keras model on the same rows: the
    # scale the gate's relative tolerance applies to, stored so that parity
    # can be re-checked from report.json alone.
    max_abs_ref: float
    runtime: str | None  # what re-ran it
    details: dict
    failed: bool = False  # writing or re-checking it raised an MpconvertError
    reason: str | None = None  # why it failed, with the fix
    # Several outputs: {output name: {max_abs_diff, max_abs_ref}}, each judged on its own scale.
    outputs: dict | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _max_abs(outputs: list[np.ndarray]) -> float:
    # Finite values only: NaN outputs already make max_abs_diff None (a
    # failure), and report.json must stay valid JSON.
    return max((float(np.abs(o[np.isfinite(o)]).max(initial=0.0)) for o in outputs), default=0.0)


def input_specs(signature: Signature) -> list:
    import tensorflow as tf

    return [tf.TensorSpec(spec.shape, spec.dtype, name=spec.name) for spec in signature.inputs]


def serving_fn(model: Any, signature: Signature):
    """model(inputs) -> {output name: tensor}, so the signature keeps the model's names."""
    names = [spec.name for spec in signature.outputs]

    def serve(*inputs):
        outputs = output_list(model, model(list(inputs) if len(inputs) > 1 else inputs[0], training=False))
        return dict(zip(names, outputs))

    return serve


def write_savedmodel(model: Any, framework: Framework, signature: Signature, path: Path) -> None:
    if framework.is_keras3:
        archive = framework.module.export.ExportArchive()
        archive.track(model)
        archive.add_endpoint("serve", serving_fn(model, signature), input_signature=input_specs(signature))
        archive.write_out(str(path), verbose=False)
    else:
        # A Keras-2 SavedModel written by tf-keras reloads as a Keras model
        # with its per-layer policies (tf_keras.models.load_model).
        model.save(str(path), save_format="tf", include_optimizer=False)


def run_savedmodel(
    path: Path, signature: Signature, inputs: list[np.ndarray], signature_name: str = "serving_default"
) -> tuple[list[np.ndarray], dict]:
    """Reload the SavedModel once: its outputs on `inputs`, and its signature's dtypes."""
    import tensorflow as tf

    serving = tf.saved_model.load(str(path)).signatures[signature_name]
    feeds = {spec.name: tf.constant(x) for spec, x in zip(signature.inputs, inputs)}
    result = serving(**feeds)
    names = [spec.name for spec in signature.outputs]
    keys = names if set(names) <= set(result) else sorted(result)
    _, input_specs = serving.structured_input_signature
    dtypes = {
        "inputs": {k: v.dtype.name for k, v in input_specs.items()},
        "outputs": {k: v.dtype.name for k, v in serving.structured_outputs.items()},
    }
    return [result[k].numpy() for k in keys], dtypes


def _artifact(
    kind: str, path: Path, expected: list, got: list, runtime: str, details: dict, signature: Signature
) -> Artifact:
    """An artifact's parity over all outputs; with several outputs, each one's too (by name)."""
    outputs = None
    if len(signature.outputs) > 1:
        outputs = {
            spec.name: {"max_abs_diff": max_abs_diff([e], [g]), "max_abs_ref": _max_abs([e])}
            for spec, e, g in zip(signature.outputs, expected, got)
        }
    return Artifact(
        kind, path.name, _size(path), max_abs_diff(expected, got), _max_abs(expected), runtime, details, outputs=outputs
    )


def export_all(
    model: Any,
    framework: Framework,
    signature: Signature,
    inputs: list[np.ndarray],
    out: Path,
    options: ExportOptions,
) -> list[Artifact]:
    """Write and re-check every requested artifact under `out` (a private temp folder)."""
    rows = [x[: options.parity_samples] for x in inputs]
    expected = predict(model, rows)
    writers = []  # (kind, path, write and re-check it)
    if "savedmodel" in options.kinds:
        writers.append(
            (
                "savedmodel",
                out / "savedmodel",
                lambda path: _savedmodel(model, framework, signature, path, rows, expected),
            )
        )
        if framework.is_keras3:
            writers.append(
                (
                    "keras",
                    out / "model.keras",
                    lambda path: _keras_file(model, framework, signature, path, rows, expected),
                )
            )
    if "onnx" in options.kinds:
        writers.append(
            ("onnx", out / "model.onnx", lambda path: _onnx(model, signature, path, rows, expected, options.opset))
        )
    needed = estimated_bytes(model, options.kinds, framework)
    return [_guarded(kind, path, expected, write, needed) for kind, path, write in writers]


def export_graph(model: Any, inputs: list[np.ndarray], out: Path, options: ExportOptions) -> list[Artifact]:
    """The graph-level path's artifacts (a graph.FrozenGraph): its SavedModel and ONNX file, each re-run."""
    rows = [x[: options.parity_samples] for x in inputs]
    expected = model.predict(rows)
    writers = []
    if "savedmodel" in options.kinds:
        writers.append(("savedmodel", out / "savedmodel", lambda path: _graph_savedmodel(model, path, rows, expected)))
    if "onnx" in options.kinds:
        writers.append(
            ("onnx", out / "model.onnx", lambda path: _graph_onnx(model, path, rows, expected, options.opset))
        )
    needed = graph_bytes(model, options.kinds)
    return [_guarded(kind, path, expected, write, needed) for kind, path, write in writers]


def graph_bytes(model: Any, kinds: tuple[str, ...]) -> int:
    """About how much a graph-level output folder takes: the frozen graph once per artifact."""
    return int(model.graph_def.ByteSize() * (("savedmodel" in kinds) + ("onnx" in kinds))) + _OVERHEAD


def _graph_savedmodel(model: Any, path: Path, rows: list[np.ndarray], expected) -> Artifact:
    model.save(path)
    got, details = run_savedmodel(path, model.signature, rows, model.signature_name)
    return _artifact("savedmodel", path, expected, got, "tensorflow", details, model.signature)


def _graph_onnx(model: Any, path: Path, rows: list[np.ndarray], expected, opset: int) -> Artifact:
    from .onnx.export import graph_to_onnx

    exported = graph_to_onnx(model.graph_def, model.input_tensors, model.output_tensors, path, opset=opset)
    feeds = dict(zip(exported.input_names, rows))
    return _onnx_artifact(exported, feeds, list(model.output_tensors), expected, model.signature)


# Bytes of graph, metadata and report beside the weights in an output folder
# (a few hundred KB for the sample models); a floor for the estimate.
_OVERHEAD = 1 << 20


def estimated_bytes(model: Any, kinds: tuple[str, ...], framework: Framework) -> int:
    """About how much an output folder takes: the weights once per file that holds them.

    A SavedModel and a .keras file keep float32 variables; the ONNX file
    keeps 16-bit weights (half).
    """
    weights = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    copies = 0.0
    if "savedmodel" in kinds:
        copies += 2.0 if framework.is_keras3 else 1.0  # the SavedModel, and model.keras beside it
    if "onnx" in kinds:
        copies += 0.5
    return int(weights * copies) + _OVERHEAD


def _guarded(kind: str, path: Path, expected: list, write: Callable[[Path], Artifact], needed: int) -> Artifact:
    """`write(path)`, or a failed Artifact with the reason when it raises an MpconvertError.

    A half-written file is removed: nothing in the output folder may look
    like an artifact that was not checked. A full disk (WriteError) fails
    the whole run instead: no other artifact would fit either.
    """
    try:
        with writing(path, f"the {kind} artifact", needed):
            return write(path)
    except WriteError:
        raise
    except MpconvertError as exc:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        reason = str(exc).replace("\n  fix:", "; fix:")
        return Artifact(kind, None, 0, None, _max_abs(expected), None, {"error": reason}, failed=True, reason=reason)


def _savedmodel(model: Any, framework: Framework, signature: Signature, path: Path, rows, expected) -> Artifact:
    write_savedmodel(model, framework, signature, path)
    got, details = run_savedmodel(path, signature, rows)
    if not framework.is_keras3:
        _check_tf_keras_policies_survive(framework, path, model)
    return _artifact("savedmodel", path, expected, got, "tensorflow", details, signature)


def _keras_file(
    model: Any, framework: Framework, signature: Signature, path: Path, rows: list[np.ndarray], expected
) -> Artifact:
    model.save(str(path))
    reloaded = framework.module.models.load_model(str(path), compile=False)
    return _artifact("keras", path, expected, predict(reloaded, rows), "keras", {}, signature)


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


def _onnx(model: Any, signature: Signature, path: Path, rows: list[np.ndarray], expected, opset: int) -> Artifact:
    from .onnx.export import keras_to_onnx

    exported = keras_to_onnx(model, input_specs(signature), path, opset=opset)
    feeds = {spec.name: x for spec, x in zip(signature.inputs, rows)}
    return _onnx_artifact(exported, feeds, [spec.name for spec in signature.outputs], expected, signature)


def _onnx_artifact(exported: Any, feeds: dict, output_names: list[str], expected, signature: Signature) -> Artifact:
    """The written ONNX file re-run on `feeds`, its outputs matched by name, against the converted model's."""
    from .onnx.run import run_onnx

    run = run_onnx(exported.path, feeds)
    details = {
        "opset": exported.opset,
        "initializer_dtypes": exported.initializer_dtypes,
        "repairs": list(exported.repairs),
        # ONNX Runtime's CPU provider lacks most bfloat16 kernels; these op
        # types were run in float32 with rounding back to 16 bits after each,
        # on a copy: the file as written did not run here.
        "emulated_16bit_ops": list(run.promoted_ops),
        "ran_as_written": run.native,
    }
    got = run.by_name(output_names)
    return _artifact("onnx", exported.path, expected, got, run.checked_with, details, signature)
