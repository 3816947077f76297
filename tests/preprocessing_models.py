"""Small Keras 3 models made of the preprocessing layers, on integer and float inputs, with data to convert them."""

from __future__ import annotations

import numpy as np

VOCAB = np.arange(0, 20, 2, dtype=np.int64)  # 10 known ids; odd ids are out of vocabulary
BOUNDARIES = [-2.0, 0.0, 2.0]


def rows(n: int = 800, seed: int = 0) -> dict[str, np.ndarray]:
    """ids (n, 1) int64 in [0, 20), num (n, 1) float32, and a label mixing both."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 20, size=(n, 1)).astype(np.int64)
    num = (rng.normal(size=(n, 1)) * 3).astype(np.float32)
    label = ((ids[:, 0] % 3 == 0) ^ (num[:, 0] > 0)).astype(np.int64)
    return {"ids": ids, "num": num, "y": label}


def layer_model(kind: str):
    """One preprocessing layer on its own input, its output as the model's (no training needed)."""
    import keras

    if kind in ("integer_lookup", "one_hot", "multi_hot", "count"):
        inputs = keras.Input((3,) if kind in ("multi_hot", "count") else (1,), dtype="int64", name="ids")
        looked = keras.layers.IntegerLookup(vocabulary=VOCAB, name="lookup")(inputs)
        if kind == "integer_lookup":
            return keras.Model(inputs, looked)
        encoded = keras.layers.CategoryEncoding(num_tokens=len(VOCAB) + 1, output_mode=kind, name="encode")(looked)
        return keras.Model(inputs, encoded)
    inputs = keras.Input((3,), name="num")
    layer = {
        "discretization": lambda: keras.layers.Discretization(bin_boundaries=BOUNDARIES, name="bins"),
        "normalization": lambda: keras.layers.Normalization(mean=[1.0, 2.0, 3.0], variance=[4.0, 9.0, 16.0]),
        "rescaling": lambda: keras.layers.Rescaling(0.5, offset=0.25, name="rescale"),
    }[kind]()
    return keras.Model(inputs, layer(inputs))


def layer_inputs(kind: str, n: int = 64, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind in ("integer_lookup", "one_hot"):
        return rng.integers(0, 20, size=(n, 1)).astype(np.int64)
    if kind in ("multi_hot", "count"):
        return rng.integers(0, 20, size=(n, 3)).astype(np.int64)
    # Every boundary itself among the values: Bucketize puts x == b in the bucket above b.
    values = (rng.normal(size=(n, 3)) * 3).astype(np.float32)
    values[0] = BOUNDARIES
    return values


def tabular(path, seed: int = 0):
    """ids -> IntegerLookup -> one-hot, num -> Discretization -> one-hot and Normalization, into a classifier."""
    import keras

    keras.utils.set_random_seed(seed)
    ids = keras.Input((1,), dtype="int64", name="ids")
    num = keras.Input((1,), name="num")
    looked = keras.layers.IntegerLookup(vocabulary=VOCAB, name="lookup")(ids)
    id_hot = keras.layers.CategoryEncoding(num_tokens=len(VOCAB) + 1, output_mode="one_hot", name="id_hot")(looked)
    bins = keras.layers.Discretization(bin_boundaries=BOUNDARIES, name="bins")(num)
    bin_hot = keras.layers.CategoryEncoding(num_tokens=len(BOUNDARIES) + 1, output_mode="one_hot", name="bin_hot")(bins)
    scaled = keras.layers.Rescaling(0.2, name="rescale")(keras.layers.Normalization(mean=0.0, variance=9.0)(num))
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(
        keras.layers.Concatenate()([id_hot, bin_hot, scaled])
    )
    model = keras.Model({"ids": ids, "num": num}, keras.layers.Dense(2, activation="softmax", name="out")(hidden))
    d = rows()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    model.fit({"ids": d["ids"][:600], "num": d["num"][:600]}, d["y"][:600], epochs=15, batch_size=32, verbose=0)
    model.save(str(path))
    return path


def tabular_npz(path):
    d = rows()
    np.savez(path, ids=d["ids"][600:], num=d["num"][600:], y=d["y"][600:])
    return path


def hashed(path, seed: int = 0):
    """ids -> Hashing (FarmHash, which ONNX cannot compute) -> one-hot -> classifier."""
    import keras

    keras.utils.set_random_seed(seed)
    ids = keras.Input((1,), dtype="int64", name="ids")
    hot = keras.layers.CategoryEncoding(num_tokens=16, output_mode="one_hot")(
        keras.layers.Hashing(16, name="hash")(ids)
    )
    model = keras.Model(ids, keras.layers.Dense(2, activation="softmax", name="out")(hot))
    d = rows()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    model.fit(d["ids"][:600], d["y"][:600], epochs=3, batch_size=32, verbose=0)
    model.save(str(path))
    return path
