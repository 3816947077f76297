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


# --- string inputs --------------------------------------------------------------------------------

COLORS = ["red", "green", "blue", "cyan", "magenta"]  # StringLookup's vocabulary: ids 1..5, 0 out of it
UNSEEN = ["black", "white", "grün"]  # out of the vocabulary; one not ASCII, so UTF-8 matters


def text_rows(n: int = 800, seed: int = 0) -> dict[str, np.ndarray]:
    """color (n, 1) '<U..' strings, ids (n, 1) int64, num (n, 1) float32, and a label mixing all three."""
    rng = np.random.default_rng(seed)
    pool = np.array(COLORS + UNSEEN)
    color = pool[rng.integers(0, len(pool), size=(n, 1))]
    d = rows(n, seed)
    warm = np.isin(color[:, 0], ["red", "magenta", "black"])
    label = (warm ^ (d["num"][:, 0] > 0) ^ (d["ids"][:, 0] % 3 == 0)).astype(np.int64)
    return {"color": color, "ids": d["ids"], "num": d["num"], "y": label}


def _fit(model, x: dict, y: np.ndarray, epochs: int) -> None:
    import keras
    import tensorflow as tf

    # Keras 3.15's fit refuses NumPy text ("Invalid dtype: str224"); a dataset of tf.string passes.
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=epochs, verbose=0)


def text_tabular(path, seed: int = 0):
    """color -> StringLookup -> one-hot; ids -> IntegerLookup -> one-hot; num -> Discretization -> one-hot,
    and Normalization -> Rescaling; into a classifier."""
    import keras

    keras.utils.set_random_seed(seed)
    color = keras.Input((1,), dtype="string", name="color")
    ids = keras.Input((1,), dtype="int64", name="ids")
    num = keras.Input((1,), name="num")
    words = keras.layers.StringLookup(vocabulary=COLORS, name="words")(color)
    word_hot = keras.layers.CategoryEncoding(num_tokens=len(COLORS) + 1, output_mode="one_hot", name="word_hot")(words)
    looked = keras.layers.IntegerLookup(vocabulary=VOCAB, name="lookup")(ids)
    id_hot = keras.layers.CategoryEncoding(num_tokens=len(VOCAB) + 1, output_mode="one_hot", name="id_hot")(looked)
    bins = keras.layers.Discretization(bin_boundaries=BOUNDARIES, name="bins")(num)
    bin_hot = keras.layers.CategoryEncoding(num_tokens=len(BOUNDARIES) + 1, output_mode="one_hot", name="bin_hot")(bins)
    scaled = keras.layers.Rescaling(0.2, name="rescale")(keras.layers.Normalization(mean=0.0, variance=9.0)(num))
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(
        keras.layers.Concatenate()([word_hot, id_hot, bin_hot, scaled])
    )
    out = keras.layers.Dense(2, activation="softmax", name="out")(hidden)
    model = keras.Model({"color": color, "ids": ids, "num": num}, out)
    d = text_rows()
    _fit(model, {k: d[k][:600] for k in ("color", "ids", "num")}, d["y"][:600], epochs=20)
    model.save(str(path))
    return path


def text_lookup(path, seed: int = 0):
    """color -> StringLookup -> one-hot, num -> Normalization, into a classifier: the string table alone
    (LiteRT's converter has a builtin for string-keyed tables; tests/test_inexpressible.py has IntegerLookup's)."""
    import keras

    keras.utils.set_random_seed(seed)
    color = keras.Input((1,), dtype="string", name="color")
    num = keras.Input((1,), name="num")
    words = keras.layers.StringLookup(vocabulary=COLORS, output_mode="one_hot", name="words")(color)
    scaled = keras.layers.Normalization(mean=0.0, variance=9.0)(num)
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(keras.layers.Concatenate()([words, scaled]))
    model = keras.Model({"color": color, "num": num}, keras.layers.Dense(2, activation="softmax", name="out")(hidden))
    d = text_rows()
    _fit(model, {k: d[k][:600] for k in ("color", "num")}, d["y"][:600], epochs=10)
    model.save(str(path))
    return path


def text_tabular_npz(path, text_as: str = "unicode"):
    """The last 200 rows to validate on, the first 600 to fine-tune on; text as '<U..' or as UTF-8 bytes."""
    d = text_rows()
    if text_as == "bytes":
        d["color"] = np.char.encode(d["color"], "utf-8")
    arrays = {k: v[600:] for k, v in d.items()} | {f"{k}_train": v[:600] for k, v in d.items()}
    np.savez(path, **arrays)
    return path


def hashed(path, text: bool = False, seed: int = 0):
    """ids (or text) -> Hashing (FarmHash, which ONNX cannot compute) -> one-hot -> classifier."""
    import keras

    keras.utils.set_random_seed(seed)
    name, d = ("color", text_rows()) if text else ("ids", rows())
    given = keras.Input((1,), dtype="string" if text else "int64", name=name)
    hot = keras.layers.CategoryEncoding(num_tokens=16, output_mode="one_hot")(
        keras.layers.Hashing(16, name="hash")(given)
    )
    model = keras.Model(given, keras.layers.Dense(2, activation="softmax", name="out")(hot))
    _fit(model, d[name][:600], d["y"][:600], epochs=3)
    model.save(str(path))
    return path


def hashed_npz(path, text: bool = False):
    """The validation rows of `hashed`."""
    name, d = ("color", text_rows()) if text else ("ids", rows())
    np.savez(path, x=d[name][600:], y=d["y"][600:])
    return path


def string_layer_model(output_mode: str):
    """StringLookup alone on a string input: (n, 1) for int and one_hot, (n, 3) for multi_hot and count."""
    import keras

    width = 3 if output_mode in ("multi_hot", "count") else 1
    words = keras.Input((width,), dtype="string", name="words")
    return keras.Model(
        words, keras.layers.StringLookup(vocabulary=COLORS, output_mode=output_mode, name="lookup")(words)
    )


def string_layer_inputs(output_mode: str, n: int = 64, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    width = 3 if output_mode in ("multi_hot", "count") else 1
    pool = np.array(COLORS + UNSEEN + [""])
    values = pool[rng.integers(0, len(pool), size=(n, width))]
    values[0, 0], values[1, 0] = "magenta", "grün"  # the last id, and a non-ASCII word out of the vocabulary
    return values
