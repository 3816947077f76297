"""What a conversion holds in memory: at the export, one whole model, and in the SavedModel, each weight once.

TensorFlow's oneDNN CPU allocator keeps what it frees for its own later tensors, so the models alive when
the artifacts re-load decide how far the process grows; bench/large_model_memory.py measures it on 1 GB
and 2.2 GB models. These tests pin the two fixes that a regression would undo, on tiny models.
"""

import gc

import keras
import numpy as np
import tensorflow as tf

from mpconvert.api import conversion_options
from mpconvert.data.signature import signature_of
from mpconvert.keras.frameworks import KERAS3
from mpconvert.keras.kind import write_savedmodel
from mpconvert.options.export import ExportOptions, SaveOptions
from mpconvert.pipeline import convert_and_save
from mpconvert.system.hooks import Hooks

NAME = "memory_probe"  # kept by every rebuild of the model (they are built from its config)


def probe_model():
    x = keras.Input((16,), name="x")
    h = keras.layers.Dense(32, activation="relu", name="hidden")(x)
    return keras.Model(x, keras.layers.Dense(4, activation="softmax", name="probs")(h), name=NAME)


def lookup_model():
    ids = keras.Input((3,), dtype="int64", name="ids")
    h = keras.layers.IntegerLookup(vocabulary=[3, 5, 7], name="lookup")(ids)
    h = keras.layers.Embedding(5, 8, name="embed")(h)
    h = keras.layers.Flatten()(h)
    return keras.Model(ids, keras.layers.Dense(2, name="out")(h))


def alive(name: str) -> list[set[str]]:
    """The layer policies of each model of this name that is still in memory: reachable, or a cycle of
    references not collected yet (so no collection here)."""
    return [
        {layer.dtype_policy.name for layer in found.layers}
        for found in gc.get_objects()
        if isinstance(found, keras.Model) and found.name == name
    ]


def test_the_export_starts_with_the_converted_model_alone(tmp_path):
    probe_model().save(tmp_path / "m.keras")
    at_export: list[list[set[str]]] = []
    hooks = Hooks(stage=lambda stage: at_export.append(alive(NAME)) if stage == "export" else None)
    options = conversion_options(tmp_path / "m.keras", "mixed_bfloat16", speed=False, pad_multiple=0)
    save = SaveOptions(tmp_path / "out", ExportOptions(kinds=("savedmodel",)))

    report, _ = convert_and_save(options, save, hooks)

    assert report.exit_code == 0
    # One whole model: the converted one (its hidden layer in bfloat16); the float32 original, which the
    # golden rows were the last to run, is unreferenced and collected, so its memory is the artifacts' to reuse.
    assert at_export == [[{"float32", "mixed_bfloat16"}]]
    assert (tmp_path / "out" / "golden.npz").is_file()


def stored_values(path) -> int:
    """How many numbers the SavedModel's variables file holds."""
    listed = tf.train.list_variables(str(path / "variables" / "variables"))
    return sum(int(np.prod(shape)) for name, shape in listed if name != "_CHECKPOINTABLE_OBJECT_GRAPH")


def test_the_savedmodel_holds_each_weight_once(tmp_path):
    for model, rows in (
        (probe_model(), [np.random.default_rng(0).normal(size=(5, 16)).astype(np.float32)]),
        (lookup_model(), [np.array([[3, 5, 9], [7, 7, 3]], dtype=np.int64)]),  # its table must go along
    ):
        path = tmp_path / model.name
        signature = signature_of(model)
        write_savedmodel(model, KERAS3, signature, path)

        # Keras 3.15's own ExportArchive.track wrote 2x model.count_params() (keras-team/keras#23553).
        assert stored_values(path) == model.count_params()
        reloaded = tf.saved_model.load(str(path))
        assert len(reloaded.variables) == len(model.variables)  # the lists a reloaded archive offers
        served = reloaded.signatures["serving_default"](**{signature.inputs[0].name: tf.constant(rows[0])})
        expected = np.asarray(model(rows[0]))
        np.testing.assert_allclose(served[signature.outputs[0].name].numpy(), expected, rtol=1e-6, atol=1e-6)
