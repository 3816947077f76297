"""Model files as a newer Keras would write them, made from files this Keras saved.

Each copies a saved model, stamps it with `version` where its format keeps
the writer's Keras version, and renames the class of layer `layer` to
`new_class`, a class no installed Keras has: what a file using a layer
added in a later Keras looks like to this one.

- `.keras`: metadata.json's `keras_version`, config.json's layer.
- `.h5`: the file's `keras_version` attribute and its `model_config`.
- Keras-2 SavedModel: keras_metadata.pb's root object (its `keras_version`
  and the model config it holds) and the layer's own object.

`graph_savedmodel` does the same for a SavedModel without Keras metadata,
at graph level: saved_model.pb's `tensorflow_version`, and every node of op
type `op` renamed to `new_op`, an op no installed TensorFlow registers.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path


def _renamed(config: dict, layer: str, new_class: str) -> dict:
    """`config` (a Functional's, with its "layers") with `layer`'s class renamed; refuses a name not found."""
    found = [entry for entry in config["config"]["layers"] if entry["config"]["name"] == layer]
    assert found, f"no layer {layer!r} in the config"
    for entry in found:
        entry["class_name"] = new_class
    return config


def keras_file(source: Path, target: Path, version: str, layer: str, new_class: str) -> Path:
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            data = old.read(info)
            if info.filename == "metadata.json":
                data = json.dumps({**json.loads(data), "keras_version": version}).encode()
            elif info.filename == "config.json":
                data = json.dumps(_renamed(json.loads(data), layer, new_class)).encode()
            new.writestr(info, data)
    return target


def h5_file(source: Path, target: Path, version: str, layer: str, new_class: str) -> Path:
    import h5py

    shutil.copyfile(source, target)
    with h5py.File(target, "r+") as handle:
        config = json.loads(handle.attrs["model_config"])
        handle.attrs["model_config"] = json.dumps(_renamed(config, layer, new_class))
        handle.attrs["keras_version"] = version
    return target


def savedmodel(source: Path, target: Path, version: str, layer: str, new_class: str) -> Path:
    from tf_keras.protobuf import saved_metadata_pb2

    shutil.copytree(source, target)
    metadata = saved_metadata_pb2.SavedMetadata()
    metadata.ParseFromString((target / "keras_metadata.pb").read_bytes())
    for node in metadata.nodes:
        if not node.metadata:
            continue
        stored = json.loads(node.metadata)
        if node.node_path == "root":
            stored["keras_version"] = version
            stored["config"] = _renamed({"config": stored["config"]}, layer, new_class)["config"]
        elif stored.get("name") == layer:
            stored["class_name"] = new_class
        node.metadata = json.dumps(stored)
    (target / "keras_metadata.pb").write_bytes(metadata.SerializeToString())
    return target


def graph_savedmodel(source: Path, target: Path, version: str, op: str, new_op: str) -> Path:
    from tensorflow.core.protobuf import saved_model_pb2

    shutil.copytree(source, target)
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((target / "saved_model.pb").read_bytes())
    renamed = 0
    for meta_graph in saved.meta_graphs:
        meta_graph.meta_info_def.tensorflow_version = version
        graph = meta_graph.graph_def
        for node in [*graph.node, *(n for f in graph.library.function for n in f.node_def)]:
            if node.op == op:
                node.op = new_op
                renamed += 1
    assert renamed, f"no {op} node in {source}"
    (target / "saved_model.pb").write_bytes(saved.SerializeToString())
    return target
