"""Models whose ops no ONNX operator expresses, and lookup tables for LiteRT, with data to convert them.

`crossed`: a Keras FeatureSpace over a string feature (sex), an integer one (cp) and a float one (age),
with one crossed feature (`FeatureSpace.cross`, a HashedCrossing layer named `sex_X_cp`: TensorFlow's
SparseCross, a FarmHash of the crossed values), into a Dense head; the model takes the dict of raw
features. `int_lookup`: an IntegerLookup (an int64 -> int64 table) into a one-hot and a Dense head.
"""

from __future__ import annotations

import numpy as np

SEXES = np.array(["female", "male"])
LOOKUP_VOCAB = [3, 5, 7, 11]  # IntegerLookup's ids: 1..4, 0 for every other value


def crossed_rows(n: int = 600, seed: int = 0) -> dict[str, np.ndarray]:
    """sex (n, 1) text, cp (n, 1) int64 in [0, 4), age (n, 1) float32; y depends on the cross of sex and cp."""
    rng = np.random.default_rng(seed)
    sex = SEXES[rng.integers(0, 2, size=(n, 1))]
    cp = rng.integers(0, 4, size=(n, 1)).astype(np.int64)
    age = rng.normal(50, 10, size=(n, 1)).astype(np.float32)
    y = ((sex[:, 0] == "male") ^ (cp[:, 0] % 2 == 0)).astype(np.int64)
    return {"sex": sex, "cp": cp, "age": age, "y": y}


def crossed(path, seed: int = 0):
    import keras
    import tensorflow as tf
    from keras.utils import FeatureSpace

    keras.utils.set_random_seed(seed)
    d = crossed_rows()
    features = {k: d[k][:, 0] for k in ("sex", "cp", "age")}
    space = FeatureSpace(
        features={
            "sex": FeatureSpace.string_categorical(num_oov_indices=1),
            "cp": FeatureSpace.integer_categorical(num_oov_indices=1),
            "age": FeatureSpace.float_normalized(),
        },
        crosses=[FeatureSpace.cross(feature_names=("sex", "cp"), crossing_dim=16)],
        output_mode="concat",
    )
    space.adapt(tf.data.Dataset.from_tensor_slices(features).batch(64))
    encoded = space.get_encoded_features()
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(encoded)
    model = keras.Model(space.get_inputs(), keras.layers.Dense(2, activation="softmax", name="out")(hidden))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    # Keras 3.15's fit refuses NumPy text ("Invalid dtype: str224"); a dataset of tf.string passes.
    x = {k: tf.constant(d[k][:400]) for k in ("sex", "cp", "age")}
    model.fit(tf.data.Dataset.from_tensor_slices((x, d["y"][:400])).batch(32), epochs=4, verbose=0)
    model.save(str(path))
    return path


def crossed_npz(path):
    """The last 200 rows of `crossed_rows`, one key per input and `y`."""
    d = crossed_rows()
    np.savez(path, **{k: v[400:] for k, v in d.items()})
    return path


def int_lookup(path, seed: int = 0):
    """ids (n, 1) int64 -> IntegerLookup(LOOKUP_VOCAB) -> one-hot (5) -> Dense(2, softmax)."""
    import keras

    keras.utils.set_random_seed(seed)
    ids = keras.Input((1,), dtype="int64", name="ids")
    looked = keras.layers.IntegerLookup(vocabulary=LOOKUP_VOCAB, name="id_lookup")(ids)
    hot = keras.layers.CategoryEncoding(num_tokens=len(LOOKUP_VOCAB) + 1, output_mode="one_hot")(looked)
    model = keras.Model(ids, keras.layers.Dense(2, activation="softmax", name="out")(hot))
    model.save(str(path))
    return path


def int_lookup_npz(path, n: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 13, size=(n, 1)).astype(np.int64)
    np.savez(path, x=ids, y=(ids[:, 0] % 2).astype(np.int64))
    return path
