"""SavedModels without Keras metadata, built by committed code: what the graph-level path converts.

- `keras_export`: a Keras 3 `model.export()` of a small CNN classifier (sigmoid-free softmax head).
- `two_matmuls`: a tf.Module with two matmuls and a softmax, saved with tf.saved_model.save.
- `two_inputs`: a tf.Module whose signature takes two named inputs and returns two outputs.
- `overflowing`: a classifier whose side branch reaches ~5e5 (beyond float16's 65504) while the rest does not.
- `offset`: a classifier whose first matmul's output rides on a +1000 offset that the next op takes
  away: in bfloat16 (spacing 4 at 1000) the signal is rounded away without any overflow, so only
  the accuracy-driven search finds the node to keep (the first matmul); `offset_npz` labels its rows.
- `no_signatures`: a tf.Module saved without any signature.
- `transformer`: a Keras 3 `model.export()` of a one-block transformer encoder (Embedding,
  MultiHeadAttention, residual + LayerNormalization, pooling, softmax) trained on
  `majority_tokens` rows; `transformer_npz` holds rows it never saw. Its embedding lookup
  (GatherV2, whose dtype attribute is Tparams, not T) feeds the 16-bit query/key/value matmuls.
- `typed_edges`: a GraphDef whose float32 edges come from ops typed by other attributes than T
  (GatherV2, Cast, Split, BatchMatMulV3) into nodes the rewrite puts in 16 bits.
- `two_splits`: output 1 of node `split` and output 0 of node `split_1` both need a Cast to 16 bits.
"""

from __future__ import annotations

import numpy as np


def keras_export(path, seed: int = 0):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    with np.load(_digits(), allow_pickle=False) as npz:
        x, y = npz["x_train"].reshape(-1, 8, 8, 1), npz["y_train"]
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy")
    model.fit(x, y, epochs=15, batch_size=64, verbose=0)
    model.export(str(path), verbose=False)
    return path


def digits_npz(path):
    """The digits data as 8x8x1 images (x, y: the model has one input)."""
    with np.load(_digits(), allow_pickle=False) as npz:
        np.savez(path, x=npz["x"].reshape(-1, 8, 8, 1), y=npz["y"])
    return path


def _digits():
    from conftest import SAMPLES

    return SAMPLES / "data" / "digits.npz"


def two_matmuls(path):
    import tensorflow as tf

    rng = np.random.default_rng(0)

    class Net(tf.Module):
        def __init__(self):
            super().__init__()
            self.w1 = tf.Variable(rng.normal(size=(16, 32)).astype(np.float32) * 0.3)
            self.b1 = tf.Variable(np.zeros(32, np.float32))
            self.w2 = tf.Variable(rng.normal(size=(32, 4)).astype(np.float32) * 0.3)

        @tf.function(input_signature=[tf.TensorSpec((None, 16), tf.float32, name="features")])
        def serve(self, features):
            hidden = tf.nn.relu(tf.matmul(features, self.w1) + self.b1)
            return {"probabilities": tf.nn.softmax(tf.matmul(hidden, self.w2))}

    return _saved(Net(), path)


def overflowing(path):
    """A classifier with a side branch whose float32 activations reach ~5e5: float16 overflows only there."""
    import tensorflow as tf

    rng = np.random.default_rng(2)

    class Net(tf.Module):
        def __init__(self):
            super().__init__()
            self.w1 = tf.Variable(rng.normal(size=(16, 32)).astype(np.float32) * 0.3)
            self.w2 = tf.Variable(rng.normal(size=(32, 4)).astype(np.float32) * 0.3)
            self.big = tf.Variable(rng.normal(size=(16, 8)).astype(np.float32) * 3e4)
            self.small = tf.Variable(rng.normal(size=(8, 4)).astype(np.float32) * 3e-5)

        @tf.function(input_signature=[tf.TensorSpec((None, 16), tf.float32, name="features")])
        def serve(self, features):
            hidden = tf.nn.relu(tf.matmul(features, self.w1))
            side = tf.matmul(tf.nn.relu(tf.matmul(features, self.big)), self.small)
            return {"probabilities": tf.nn.softmax(tf.matmul(hidden, self.w2) + side)}

    return _saved(Net(), path)


def two_inputs(path):
    import tensorflow as tf

    rng = np.random.default_rng(1)

    class Net(tf.Module):
        def __init__(self):
            super().__init__()
            self.a = tf.Variable(rng.normal(size=(6, 8)).astype(np.float32) * 0.4)
            self.b = tf.Variable(rng.normal(size=(3, 8)).astype(np.float32) * 0.4)
            self.out = tf.Variable(rng.normal(size=(8, 1)).astype(np.float32) * 0.4)

        @tf.function(
            input_signature=[
                tf.TensorSpec((None, 6), tf.float32, name="left"),
                tf.TensorSpec((None, 3), tf.float32, name="right"),
            ]
        )
        def serve(self, left, right):
            joined = tf.nn.relu(tf.matmul(left, self.a) + tf.matmul(right, self.b))
            return {"score": tf.matmul(joined, self.out), "joined_mean": tf.reduce_mean(joined, axis=1)}

    return _saved(Net(), path)


def offset(path):
    import tensorflow as tf

    rng = np.random.default_rng(3)

    class Net(tf.Module):
        def __init__(self):
            super().__init__()
            self.w1 = tf.Variable(rng.normal(size=(16, 32)).astype(np.float32) * 0.3)
            self.w2 = tf.Variable(rng.normal(size=(32, 4)).astype(np.float32) * 0.3)
            self.w3 = tf.Variable(rng.normal(size=(4, 4)).astype(np.float32) * 0.5)

        @tf.function(input_signature=[tf.TensorSpec((None, 16), tf.float32, name="features")])
        def serve(self, features):
            lifted = tf.nn.bias_add(tf.matmul(features, self.w1), tf.constant(np.full(32, 1000.0, np.float32)))
            hidden = tf.nn.relu(lifted - 1000.0)
            return {"probabilities": tf.nn.softmax(tf.matmul(tf.matmul(hidden, self.w2), self.w3))}

    return _saved(Net(), path)


def offset_npz(saved, path, rows: int = 400):
    """Inputs for `offset` labelled by its own float32 outputs: float32 scores 1.0."""
    import tensorflow as tf

    x = np.random.default_rng(4).normal(size=(rows, 16)).astype(np.float32)
    fn = tf.saved_model.load(str(saved)).signatures["serving_default"]
    y = np.argmax(fn(features=tf.constant(x))["probabilities"].numpy(), axis=1)
    np.savez(path, x=x, y=y)
    return path


def _saved(net, path):
    """A tf.Module with a `serve` tf.function, saved with it as its serving_default signature."""
    import tensorflow as tf

    tf.saved_model.save(net, str(path), signatures={"serving_default": net.serve})
    return path


def no_signatures(path):
    import tensorflow as tf

    module = tf.Module()
    module.v = tf.Variable(1.0)
    tf.saved_model.save(module, str(path), signatures={})
    return path


TOKENS, LENGTH, GROUPS = 50, 12, 3


def majority_tokens(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Token rows (rows, LENGTH) int32 and their class: which third of the vocabulary holds most of the row's tokens.

    Rows whose largest count is tied are drawn again, so every label is
    unambiguous and a well-trained model can score near 1.0: the accuracy
    drop then measures the 16-bit rewrite, not label noise.
    """
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    while sum(len(x) for x in xs) < rows:
        x = rng.integers(0, TOKENS, size=(rows, LENGTH), dtype=np.int32)
        counts = np.stack([np.count_nonzero(x * GROUPS // TOKENS == g, axis=1) for g in range(GROUPS)], axis=1)
        top = np.sort(counts, axis=1)
        clear = top[:, -1] > top[:, -2]
        xs.append(x[clear])
        ys.append(np.argmax(counts, axis=1)[clear])
    return np.concatenate(xs)[:rows], np.concatenate(ys)[:rows].astype(np.int64)


def attention_model(seed: int = 0):
    """Embedding, MultiHeadAttention and LayerNormalization over token rows, trained briefly on `majority_tokens`."""
    import keras

    keras.utils.set_random_seed(seed)
    tokens = keras.Input((LENGTH,), dtype="int32")
    embedded = keras.layers.Embedding(TOKENS, 16, name="emb")(tokens)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8, name="mha")(embedded, embedded)
    hidden = keras.layers.LayerNormalization(name="norm")(keras.layers.Add()([embedded, attended]))
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    model = keras.Model(tokens, keras.layers.Dense(GROUPS, activation="softmax", name="head")(pooled))
    x, y = majority_tokens(1200, seed=5)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    model.fit(x, y, epochs=8, batch_size=64, verbose=0)
    return model


def transformer(path, seed: int = 0):
    """`attention_model` as a plain SavedModel (Keras's model.export)."""
    attention_model(seed).export(str(path), verbose=False)
    return path


def transformer_npz(path, rows: int = 400):
    """Validation rows for `transformer`, from another seed than its training rows."""
    x, y = majority_tokens(rows, seed=6)
    np.savez(path, x=x, y=y)
    return path


def typed_edges():
    """A FrozenGraph (ids int32 (n, 3), x float32 (n, 4) -> out float32 (n, 4)) whose float32 edges into
    16-bit nodes come from ops typed by other attributes than T, and a residual add that must stay float32.

    - GatherV2 (Tparams) feeds a BatchMatMulV2 and an Einsum;
    - Cast (DstT) and Split's second output (num_split outputs of T) feed MatMuls;
    - BatchMatMulV3 (Ta, Tb, Tout; never retyped: no float16 CPU kernel) feeds the Einsum;
    - `emb + BatchMatMulV2(emb, w)` reads the float32 lookup beside a 16-bit matmul.
    """
    import tensorflow as tf

    from mpconvert.data.signature import TensorSpec
    from mpconvert.graph.freeze import FrozenGraph

    rng = np.random.default_rng(7)
    table = rng.normal(size=(10, 4)).astype(np.float32)
    w3, w2, w4 = (rng.normal(size=(n, 4)).astype(np.float32) * 0.5 for n in (3, 2, 4))

    @tf.function(
        input_signature=[tf.TensorSpec((None, 3), tf.int32, name="ids"), tf.TensorSpec((None, 4), tf.float32, name="x")]
    )
    def serve(ids, x):
        emb = tf.gather(tf.constant(table), ids)  # (n, 3, 4)
        counted = tf.matmul(tf.cast(ids, tf.float32), tf.constant(w3))
        _, right = tf.split(x, 2, axis=1)
        halves = tf.matmul(right, tf.constant(w2))
        scores = tf.raw_ops.BatchMatMulV3(x=emb, y=tf.transpose(emb, [0, 2, 1]), Tout=tf.float32)
        mixed = tf.reduce_sum(tf.einsum("bij,bjk->bik", scores, emb), axis=1)
        residual = tf.reduce_sum(emb + tf.matmul(emb, tf.constant(w4)), axis=1)
        return counted + halves + mixed + residual

    concrete = serve.get_concrete_function()
    return FrozenGraph(
        name="typed_edges",
        graph_def=concrete.graph.as_graph_def(),
        signature_name="serving_default",
        inputs=(TensorSpec("ids", (None, 3), "int32"), TensorSpec("x", (None, 4), "float32")),
        input_tensors=tuple(t.name for t in concrete.inputs),
        outputs=(TensorSpec("output_0", (None, 4), "float32"),),
        output_tensors=tuple(t.name for t in concrete.outputs),
    )


def two_splits():
    """A FrozenGraph (x float32 (n, 4) -> (n,) float32): sum(x[:, 2:] @ ones) + sum((2x)[:, :2] @ ones) per row.

    tf.function names the splits `split` and `split_1`, so casting `split:1` and `split_1:0` tells the two
    apart only by port: all ones in gives 2 * (2 + 4) = 12 per row, exactly, in any of the three dtypes.
    """
    import tensorflow as tf

    from mpconvert.data.signature import TensorSpec
    from mpconvert.graph.freeze import FrozenGraph

    ones = np.ones((2, 2), np.float32)

    @tf.function(input_signature=[tf.TensorSpec((None, 4), tf.float32, name="x")])
    def serve(x):
        _, right = tf.split(x, 2, axis=1)
        left, _ = tf.split(x * 2.0, 2, axis=1)
        return tf.reduce_sum(tf.matmul(right, tf.constant(ones)) + tf.matmul(left, tf.constant(ones)), axis=1)

    concrete = serve.get_concrete_function()
    return FrozenGraph(
        name="two_splits",
        graph_def=concrete.graph.as_graph_def(),
        signature_name="serving_default",
        inputs=(TensorSpec("x", (None, 4), "float32"),),
        input_tensors=tuple(t.name for t in concrete.inputs),
        outputs=(TensorSpec("output_0", (None,), "float32"),),
        output_tensors=tuple(t.name for t in concrete.outputs),
    )


def batch_centered(path):
    """Scores centred on the batch's own mean (training-mode normalization left in a serving graph).

    Its outputs for a row depend on the other rows sent with it: it cannot
    serve one row, or any batch other than the one it was checked on.
    """
    import tensorflow as tf

    rng = np.random.default_rng(3)

    class Net(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(rng.normal(size=(6, 4)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec((None, 6), tf.float32, name="x")])
        def serve(self, x):
            scores = tf.matmul(x, self.w)
            return {"centred": scores - tf.reduce_mean(scores, axis=0, keepdims=True)}

    return _saved(Net(), path)


def keras_attention(path, seed: int = 0):
    """`attention_model` saved as .keras."""
    attention_model(seed).save(str(path))
    return path


def keras_lstm(path, seed: int = 0):
    """Embedding and an LSTM over token rows of a fixed length, saved as .keras."""
    import keras

    keras.utils.set_random_seed(seed)
    tokens = keras.Input((LENGTH,), dtype="int32")
    hidden = keras.layers.LSTM(16, name="lstm")(keras.layers.Embedding(TOKENS, 16, name="emb")(tokens))
    model = keras.Model(tokens, keras.layers.Dense(GROUPS, activation="softmax", name="head")(hidden))
    x, y = majority_tokens(600, seed=5)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    model.fit(x, y, epochs=3, batch_size=64, verbose=0)
    model.save(str(path))
    return path


def keras_wide(path, seed: int = 0):
    """Dense(256) x 2 on the digits: weights dominate its files (83k parameters)."""
    import keras

    keras.utils.set_random_seed(seed)
    pixels = keras.Input((64,), name="pixels")
    hidden = keras.layers.Dense(256, activation="relu", name="wide1")(pixels)
    hidden = keras.layers.Dense(256, activation="relu", name="wide2")(hidden)
    model = keras.Model(pixels, keras.layers.Dense(10, activation="softmax", name="digit")(hidden))
    with np.load(_digits(), allow_pickle=False) as npz:
        x, y = npz["x_train"], npz["y_train"]
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    model.fit(x, y, epochs=5, batch_size=64, verbose=0)
    model.save(str(path))
    return path
