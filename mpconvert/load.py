"""Read a model file into a `Loaded` value, without running code from it.

Formats: Keras 3 `.keras`, `.h5` (Keras 3 first, tf-keras for files written by
tf.keras 2.x that Keras 3 rejects), and Keras-2 SavedModel folders (those with
`keras_metadata.pb`), which stay in tf-keras.

Before any framework touches the file, its layer configs are read as plain
JSON and a `Lambda` layer (marshalled Python bytecode that runs on load) is
refused unless the user opted in. Keras 3's `safe_mode` does the same for
`.keras`, but tf-keras does not guard SavedModels or `.h5` files, so the check
is done here once for every format.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .errors import MpconvertError
from .frameworks import KERAS3, TF_KERAS, Framework, framework_of
from .options import LoadOptions

SAVEDMODEL_WITHOUT_KERAS_HINT = (
    "mpconvert rewrites per-layer dtype policies, which needs the Keras model. "
    "Re-save it from the code that built it with model.save('model.keras') "
    "(Keras 3) or model.save('dir', save_format='tf') (tf-keras), or, for a plain "
    "SavedModel, use a graph-level converter such as onnxconverter-common's "
    "float16 pass on an ONNX export instead"
)


@dataclass(frozen=True)
class Loaded:
    model: Any
    framework: Framework
    format: str  # "keras", "h5", "savedmodel", or "object" for a live model
    safe: bool  # False when the user allowed code-carrying layers
    saved_loss: Any = None  # the loss the model was compiled with, as stored


def detect_format(path: Path) -> str:
    if not path.exists():
        raise MpconvertError(
            f"model not found: {path}",
            hint="pass a .keras or .h5 file, or a Keras SavedModel folder",
        )
    if path.is_dir():
        if not (path / "saved_model.pb").is_file():
            raise MpconvertError(
                f"{path} is a folder but not a SavedModel (no saved_model.pb inside)",
                hint="pass the SavedModel folder itself, or a .keras / .h5 file",
            )
        if not (path / "keras_metadata.pb").is_file():
            raise MpconvertError(
                f"{path} is a SavedModel without Keras metadata (no keras_metadata.pb): "
                "its layers and their dtype policies cannot be recovered",
                hint=SAVEDMODEL_WITHOUT_KERAS_HINT,
            )
        return "savedmodel"
    suffix = path.suffix.lower()
    if suffix == ".keras":
        return "keras"
    if suffix in (".h5", ".hdf5"):
        return "h5"
    raise MpconvertError(
        f"unsupported model file {path.name!r}",
        hint="mpconvert reads .keras and .h5 files and Keras SavedModel folders",
    )


def read_stored_config(path: Path, fmt: str) -> dict:
    """The model's layer config as plain JSON, read without deserializing."""
    try:
        if fmt == "keras":
            with zipfile.ZipFile(path) as archive:
                return json.loads(archive.read("config.json"))
        if fmt == "h5":
            import h5py

            with h5py.File(path, "r") as handle:
                raw = handle.attrs.get("model_config")
                training = handle.attrs.get("training_config")
            if raw is None:
                raise MpconvertError(
                    f"{path} holds weights only (no model_config)",
                    hint="save the whole model with model.save('model.h5'), not save_weights",
                )
            return {"model_config": _json(raw), "training_config": _json(training) if training is not None else None}
        return _savedmodel_config(path)
    except MpconvertError:
        raise
    except Exception as exc:  # zipfile, h5py and protobuf each raise their own kinds
        raise MpconvertError(
            f"cannot read {path}: the file is damaged or not a Keras model ({_first_line(exc)})",
            hint="check that the file was completely written, e.g. re-save or re-download it",
        ) from exc


def _json(raw: str | bytes) -> Any:
    return json.loads(raw if isinstance(raw, str) else raw.decode("utf-8"))


def _saved_loss(stored: dict, fmt: str) -> Any:
    """The loss the model was compiled with, as stored in the file, or None."""
    if fmt == "keras":
        compile_config = stored.get("compile_config") or {}
    elif fmt == "h5":
        compile_config = stored.get("training_config") or {}
    else:
        compile_config = (stored.get("root") or {}).get("training_config") or {}
    loss = compile_config.get("loss")
    # Per-output losses: the fine-tune trains on the first output.
    if isinstance(loss, list) and loss:
        return loss[0]
    if isinstance(loss, dict) and "class_name" not in loss and loss:
        return next(iter(loss.values()))
    return loss


def _savedmodel_config(path: Path) -> dict:
    from tf_keras.protobuf import saved_metadata_pb2

    metadata = saved_metadata_pb2.SavedMetadata()
    metadata.ParseFromString((path / "keras_metadata.pb").read_bytes())
    nodes = [json.loads(node.metadata) for node in metadata.nodes if node.metadata]
    # The root object (node_path "root") carries the whole model config; the
    # other nodes repeat each layer's config, which also covers Lambdas in
    # models whose root has no config (subclassed models).
    root = next((n for n, m in zip(nodes, metadata.nodes) if m.node_path == "root"), {})
    return {"root": root, "nodes": nodes}


def _walk_class_names(obj: Any) -> Iterator[tuple[str, str]]:
    """(class_name, name) of every serialized object inside a config."""
    if isinstance(obj, dict):
        class_name = obj.get("class_name")
        if isinstance(class_name, str):
            config = obj.get("config")
            name = config.get("name", "?") if isinstance(config, dict) else obj.get("name", "?")
            yield class_name, str(name)
        for value in obj.values():
            yield from _walk_class_names(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _walk_class_names(value)


def refuse_code_layers(path: Path, stored_config: dict) -> None:
    lambdas = sorted({name for cls, name in _walk_class_names(stored_config) if cls == "Lambda"})
    if lambdas:
        raise MpconvertError(
            f"{path} contains Lambda layer(s) {', '.join(lambdas)}, whose Python code "
            "would run while loading",
            hint="only if you trust this file, pass --unsafe-deserialization",
        )


def load_model(options: LoadOptions) -> Loaded:
    path = options.path
    if path is None:
        return _live(options.source)
    fmt = detect_format(path)
    stored = read_stored_config(path, fmt)
    if not options.unsafe_deserialization:
        refuse_code_layers(path, stored)
    safe = not options.unsafe_deserialization
    loss = _saved_loss(stored, fmt)
    if fmt == "savedmodel":
        return Loaded(_load_with(TF_KERAS, path, safe), TF_KERAS, fmt, safe, loss)
    if fmt == "keras":
        return Loaded(_load_with(KERAS3, path, safe), KERAS3, fmt, safe, loss)
    try:
        return Loaded(_load_with(KERAS3, path, safe), KERAS3, fmt, safe, loss)
    except MpconvertError as keras3_error:
        # Files written by tf.keras 2.x carry config keys Keras 3 rejects
        # (an LSTM's `time_major`, for one); tf-keras reads them natively.
        try:
            model = _load_with(TF_KERAS, path, safe)
        except MpconvertError as tf_keras_error:
            raise MpconvertError(
                f"neither Keras 3 nor tf-keras can load {path}: "
                f"Keras 3 said: {keras3_error.message}; tf-keras said: {tf_keras_error.message}",
                hint=keras3_error.hint,
            ) from None
        return Loaded(model, TF_KERAS, fmt, safe, loss)


def _live(model: Any) -> Loaded:
    """A model object from the Python API. It is only read: the rewrite
    builds a new model from its config and copies the weights across."""
    framework = framework_of(model)
    if framework is None:
        raise MpconvertError(
            f"model= got {type(model).__name__}, which is neither a path nor a Keras model",
            hint="pass a keras.Model, a tf_keras Model, or the path of a .keras/.h5 file or Keras SavedModel folder",
        )
    loss = getattr(model, "loss", None)
    # Its code, Lambdas included, is already running in this process: the
    # rebuild from its config needs no protection from it.
    return Loaded(model, framework, "object", False, loss if isinstance(loss, (str, dict)) else None)


def _load_with(framework: Framework, path: Path, safe: bool) -> Any:
    with framework.preserved_global_policy(), framework.deserialization(safe):
        try:
            if framework.is_keras3:
                model = framework.module.models.load_model(path, compile=False, safe_mode=safe)
            else:
                model = framework.module.models.load_model(str(path), compile=False)
        except Exception as exc:
            raise _load_error(path, exc) from exc
    if not isinstance(model, framework.module.Model):
        raise MpconvertError(
            f"{path} did not load as a Keras model (got {type(model).__name__})",
            hint="save the model with model.save(), not tf.saved_model.save()",
        )
    return model


def _load_error(path: Path, exc: Exception) -> MpconvertError:
    text = str(exc)
    if "Could not locate" in text or "Unknown layer" in text or "Unknown object" in text:
        return MpconvertError(
            f"{path} uses a custom class that is not importable here ({_first_line(exc)})",
            hint="import the module that defines and registers it "
            "(@keras.saving.register_keras_serializable) before converting, "
            "e.g. run mpconvert from Python with that module imported",
        )
    if "lambda" in text.lower() and "safe_mode" in text:
        return MpconvertError(
            f"{path} contains a Lambda layer whose code would run while loading",
            hint="only if you trust this file, pass --unsafe-deserialization",
        )
    return MpconvertError(
        f"cannot load {path}: {_first_line(exc)}",
        hint="check that the file is a complete Keras model saved with model.save()",
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
