"""Read a model file into a `Loaded` value, without running code from it.

Formats: Keras 3 `.keras`, `.h5`/`.hdf5` (Keras 3 first, tf-keras for files
written by tf.keras 2.x that Keras 3 rejects), and Keras-2 SavedModel folders
(those with `keras_metadata.pb`), which stay in tf-keras. `detect_format` also
recognises a SavedModel folder without `keras_metadata.pb` (Keras 3
`model.export()`, `tf.saved_model.save`) as GRAPH; such a model has no Keras
layers and is not loaded here but frozen (kinds.open_model, frozen/freeze.py).

Before any framework touches the file, its layer configs are read as plain
JSON and a `Lambda` layer (marshalled Python bytecode that runs on load) is
refused unless the user opted in. Keras 3's `safe_mode` does the same for
`.keras`, but tf-keras does not guard SavedModels or `.h5` files, so the check
is done here once for every format.
"""

from __future__ import annotations

import contextlib
import json
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpconvert.data.formats import ModelFormat, detect_format
from mpconvert.keras.frameworks import KERAS3, TF_KERAS, Framework, framework_of
from mpconvert.options.load import LoadOptions
from mpconvert.report.sections import Source
from mpconvert.system.errors import MpconvertError, first_line
from mpconvert.system.usercode import import_module
from mpconvert.system.versions import major_minor, newer_version


@dataclass(frozen=True)
class Loaded:
    model: Any
    framework: Framework
    format: ModelFormat  # KERAS, H5, SAVEDMODEL, or OBJECT for a live model
    safe: bool  # False when the user allowed code-carrying layers
    saved_loss: Any = None  # the loss the model was compiled with, as stored
    custom_objects: dict | None = None  # from the Python API, in scope for every (re)build

    def deserialization(self):
        """The scope every stage that rebuilds or reloads this model runs in."""
        return self.framework.deserialization(self.safe, self.custom_objects)

    def source(self, path: Path | None) -> Source:
        """The report's `source`: where the model came from, what read it, its inputs and outputs."""
        from mpconvert.data.signature import signature_of

        signature = signature_of(self.model)
        parameters = int(self.model.count_params())
        return Source.of(path, self.model.name, parameters, ModelFormat(self.format), self.framework.name, signature)


def read_stored_config(path: Path, fmt: ModelFormat) -> dict:
    """The model's layer config as plain JSON, read without deserializing."""
    try:
        if fmt is ModelFormat.KERAS:
            with zipfile.ZipFile(path) as archive:
                return json.loads(archive.read("config.json"))
        if fmt is ModelFormat.H5:
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
            f"cannot read {path}: the file is damaged or not a Keras model ({first_line(exc)})",
            hint="check that the file was completely written, e.g. re-save or re-download it",
        ) from exc


def _json(raw: str | bytes) -> Any:
    return json.loads(raw if isinstance(raw, str) else raw.decode("utf-8"))


def _saved_loss(stored: dict, fmt: ModelFormat) -> Any:
    """The loss the model was compiled with, as stored in the file, or None."""
    if fmt is ModelFormat.KERAS:
        compile_config = stored.get("compile_config") or {}
    elif fmt is ModelFormat.H5:
        compile_config = stored.get("training_config") or {}
    else:
        compile_config = (stored.get("root") or {}).get("training_config") or {}
    # One loss, or per-output losses as a list (output order) or a dict (by output name).
    return compile_config.get("loss")


def _savedmodel_config(path: Path) -> dict:
    from tf_keras.protobuf import saved_metadata_pb2

    metadata = saved_metadata_pb2.SavedMetadata()
    metadata.ParseFromString((path / "keras_metadata.pb").read_bytes())
    nodes = [json.loads(node.metadata) for node in metadata.nodes if node.metadata]
    # The root object (node_path "root") carries the whole model config; the
    # other nodes repeat each layer's config, which also covers Lambdas in
    # models whose root has no config (subclassed models).
    root: dict = next((n for n, m in zip(nodes, metadata.nodes) if m.node_path == "root"), {})
    return {"root": root, "nodes": nodes}


def _walk_objects(obj: Any) -> Iterator[dict]:
    """Every serialized object (a dict with a class_name) inside a config."""
    if isinstance(obj, dict):
        if isinstance(obj.get("class_name"), str):
            yield obj
        for value in obj.values():
            yield from _walk_objects(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _walk_objects(value)


def _object_name(obj: dict) -> str:
    config = obj.get("config")
    return str(config.get("name", "?") if isinstance(config, dict) else obj.get("name", "?"))


def refuse_code_layers(path: Path, stored_config: dict) -> None:
    lambdas = sorted({_object_name(o) for o in _walk_objects(stored_config) if o["class_name"] == "Lambda"})
    if lambdas:
        raise MpconvertError(
            f"{path} contains Lambda layer(s) {', '.join(lambdas)}, whose Python code would run while loading",
            hint="only if you trust this file, pass --unsafe-deserialization",
        )


def _custom_classes(stored_config: dict) -> dict[str, str | None]:
    """Registered name -> defining module of every custom class a config names.

    Keras 3 writes {"module": "mylayers", "registered_name": "mylayers>Scale"};
    tf-keras writes the registered name ("package>Scale") as the class_name.
    """
    found: dict[str, str | None] = {}
    for obj in _walk_objects(stored_config):
        module = obj.get("module")
        registered = obj.get("registered_name")
        if isinstance(module, str) and not module.startswith("keras"):
            found[registered if isinstance(registered, str) else obj["class_name"]] = module
        elif ">" in obj["class_name"]:
            found.setdefault(obj["class_name"], None)
    return found


def _refuse_missing_classes(path: Path, stored_config: dict, frameworks: tuple[Framework, ...], known: dict) -> None:
    """Name a custom class nobody registered, before a framework fails on it obscurely.

    Keras 3 reports it as "Functional could not be deserialized", and tf-keras
    revives a SavedModel's custom layer as a stand-in that cannot be rebuilt.
    """
    for registered, module in _custom_classes(stored_config).items():
        class_name = registered.rpartition(">")[2]
        if registered in known or class_name in known:
            continue
        if any(framework.module.utils.get_registered_object(registered) is not None for framework in frameworks):
            continue
        package = module or registered.partition(">")[0]
        where = f"module {module!r}" if module else f"package {package!r}"
        raise MpconvertError(
            f"{path} uses the custom class {class_name!r} (registered as {registered!r}, from {where}), "
            "which is not registered in this process",
            hint=f"pass --import {package} to import the module that defines it (that runs its code); "
            "from Python, imports=[...] or custom_objects={...}",
        )


def load_model(options: LoadOptions) -> Loaded:
    path = options.path
    for name in options.imports:
        import_module(name, f"--import {name}")
    if path is None:
        return _live(options.source, options.custom_objects)
    fmt = detect_format(path)
    with _saved_by_newer_keras(path, fmt):
        stored = read_stored_config(path, fmt)
    if not options.unsafe_deserialization:
        refuse_code_layers(path, stored)
    with _saved_by_newer_keras(path, fmt):
        return _load_file(path, fmt, stored, options)


def _load_file(path: Path, fmt: ModelFormat, stored: dict, options: LoadOptions) -> Loaded:
    safe = not options.unsafe_deserialization
    custom = _custom_scope(options.custom_objects)
    frameworks = {
        ModelFormat.KERAS: (KERAS3,),
        ModelFormat.SAVEDMODEL: (TF_KERAS,),
        ModelFormat.H5: (KERAS3, TF_KERAS),
    }[fmt]
    _refuse_missing_classes(path, stored, frameworks, custom or {})

    def loaded(framework: Framework) -> Loaded:
        model = _load_with(framework, path, safe, custom)
        return Loaded(model, framework, fmt, safe, _saved_loss(stored, fmt), custom)

    if fmt is not ModelFormat.H5:
        return loaded(frameworks[0])
    try:
        return loaded(KERAS3)
    except MpconvertError as keras3_error:
        # Files written by tf.keras 2.x carry config keys Keras 3 rejects
        # (an LSTM's `time_major`, for one); tf-keras reads them natively.
        try:
            return loaded(TF_KERAS)
        except MpconvertError as tf_keras_error:
            raise MpconvertError(
                f"neither Keras 3 nor tf-keras can load {path}: "
                f"Keras 3 said: {keras3_error.message}; tf-keras said: {tf_keras_error.message}",
                hint=keras3_error.hint,
            ) from None


def _live(model: Any, custom_objects: dict | None) -> Loaded:
    """A model object from the Python API. It is only read: the rewrite
    builds a new model from its config and copies the weights across."""
    framework = framework_of(model)
    if framework is None:
        raise MpconvertError(
            f"model= got {type(model).__name__}, which is neither a path nor a Keras model",
            hint="pass a keras.Model, a tf_keras Model, or the path of a .keras/.h5 file or SavedModel folder",
        )
    loss = getattr(model, "loss", None)
    # Its code, Lambdas included, is already running in this process: the
    # rebuild from its config needs no protection from it.
    saved_loss = loss if isinstance(loss, (str, dict)) else None
    return Loaded(model, framework, ModelFormat.OBJECT, False, saved_loss, _custom_scope(custom_objects))


def _custom_scope(custom_objects: dict | None) -> dict | None:
    """The user's custom objects, also under their class names.

    A file names a class by its registered name ("pkg>Scale"), but a model
    rebuilt from a live layer's config names an unregistered class by its
    Python name, and the rewrite rebuilds from exactly that config.
    """
    if not custom_objects:
        return None
    scope = dict(custom_objects)
    for obj in custom_objects.values():
        scope.setdefault(getattr(obj, "__name__", ""), obj)
    scope.pop("", None)
    return scope


def _load_with(framework: Framework, path: Path, safe: bool, custom_objects: dict | None) -> Any:
    with framework.preserved_global_policy(), framework.deserialization(safe, custom_objects):
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
    revived = _revived_layers(model)
    if revived:
        # Without this, the rewrite's rebuild from the config fails later with
        # "'str' object is not callable", naming neither the layer nor its class.
        layer = revived[0]
        raise MpconvertError(
            f"{path}: layer {layer.name!r} has class {type(layer).__name__!r}, which {framework.display_name} does "
            "not know, so it could only revive the layer's saved graph as a stand-in that cannot be rebuilt",
            hint="pass --import MODULE to import the module that defines and registers the class "
            "(@tf_keras.utils.register_keras_serializable); that runs its code",
        )
    return model


def _revived_layers(model: Any) -> list[Any]:
    """The layers tf-keras revived from a SavedModel's graphs because it knows no class of their name.

    Their type is a subclass of tf-keras's RevivedLayer (or RevivedNetwork)
    named after the missing class; Keras 3 refuses an unknown class instead.
    """
    return [
        layer
        for layer in model._flatten_layers(include_self=False)
        if any(c.__name__.startswith("Revived") and "saved_model" in c.__module__ for c in type(layer).__mro__)
    ]


def saved_keras_version(path: Path, fmt: ModelFormat) -> str | None:
    """The version of the Keras that wrote the file, where each format keeps it; None where it says none.

    .keras: metadata.json's `keras_version`; .h5: the file's `keras_version`
    attribute; a Keras-2 SavedModel: the root object's metadata in
    keras_metadata.pb. Read only to explain a failure, so never raises.
    """
    try:
        if fmt is ModelFormat.KERAS:
            with zipfile.ZipFile(path) as archive:
                version = json.loads(archive.read("metadata.json")).get("keras_version")
        elif fmt is ModelFormat.H5:
            import h5py

            with h5py.File(path, "r") as handle:
                version = handle.attrs.get("keras_version")
            version = version.decode("utf-8") if isinstance(version, bytes) else version
        elif fmt is ModelFormat.SAVEDMODEL:
            version = _savedmodel_config(path)["root"].get("keras_version")
        else:
            return None
    except Exception:  # a damaged file: the failure being explained says so already
        return None
    return version if isinstance(version, str) else None


def _newer_than_installed(path: Path, fmt: ModelFormat) -> tuple[str, Framework] | None:
    """(the file's Keras version, the installed framework that reads it) when the file is the newer."""
    saved = saved_keras_version(path, fmt)
    written = major_minor(saved) if saved else None
    if saved is None or written is None:
        return None
    # A Keras-2 SavedModel is read by tf-keras; an .h5 by the one of its major version
    # (tf.keras 2.x wrote 2.x, Keras 3 writes 3.x); a .keras file by Keras 3.
    reader = TF_KERAS if fmt is ModelFormat.SAVEDMODEL or (fmt is ModelFormat.H5 and written[0] <= 2) else KERAS3
    return (saved, reader) if newer_version(saved, reader.version) else None


@contextlib.contextmanager
def _saved_by_newer_keras(path: Path, fmt: ModelFormat) -> Iterator[None]:
    """Say so when a file that fails to load was written by a newer Keras than the one installed.

    A newer Keras writes layer classes and config keys an older one does not
    know ("Could not deserialize 'keras.layers.FancyNewLayer'"), and the
    failure itself never names the version: the fix is a newer Keras, not a
    re-download.
    """
    try:
        yield
    except MpconvertError as exc:
        newer = _newer_than_installed(path, fmt)
        if newer is None:
            raise
        saved, reader = newer
        wanted = ".".join(saved.split(".")[:2])
        package = "keras" if reader.is_keras3 else "tf-keras"
        raise MpconvertError(
            f"{path} was saved by Keras {saved}, and this is {reader.display_name} {reader.version}: {exc.message}",
            hint=f"load it with {reader.display_name} {wanted} or newer (pip install -U '{package}>={wanted}'), "
            f"or re-save the model with {reader.display_name} {reader.version} from the code that built it",
        ) from exc


def _load_error(path: Path, exc: Exception) -> MpconvertError:
    text = " ".join(str(e) for e in _chain(exc))
    missing = re.search(r"(?:Could not locate (?:class|function) |Unknown (?:layer|object)[^:]*: )'([^']+)'", text)
    if missing or "could not be deserialized properly" in text:
        what = f"the custom class {missing.group(1)!r}" if missing else "a custom class"
        return MpconvertError(
            f"{path} uses {what}, which is not registered in this process ({first_line(exc)})",
            hint="pass --import MODULE to import the module that defines and registers it "
            "(@keras.saving.register_keras_serializable); that runs its code",
        )
    if "lambda" in text.lower() and "safe_mode" in text:
        return MpconvertError(
            f"{path} contains a Lambda layer whose code would run while loading",
            hint="only if you trust this file, pass --unsafe-deserialization",
        )
    return MpconvertError(
        f"cannot load {path}: {first_line(exc)}",
        hint="check that the file is a complete Keras model saved with model.save()",
    )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and its causes: Keras wraps the real one ("Could not locate class")."""
    seen = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__
