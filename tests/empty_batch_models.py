"""Models whose tf2onnx exports failed on an empty batch (issue 37), and data to convert them, built by committed code.

* `spam_bilstm_h5`: Embedding + Bidirectional(LSTM) + Dense, a tf-keras
  legacy .h5 as a pretrained SMS spam classifier is. Without `mask_zero`
  tf2onnx writes one bidirectional ONNX LSTM op, and ONNX Runtime 1.31
  calls std::terminate on 0 rows (SIGABRT; with mask_zero=True it writes
  Loops, which serve 0 rows). It aborted at every size tried (vocab 50 to
  5000, maxlen 8 to 80, 4 to 64 units; float32, float16 and bfloat16).
* `masking_lstm`: Sequential Masking + LSTM (a Transpose "perm size: 3 does
  not match input rank: 4" on 0 rows).
* `vit_classifier`: a tiny keras-hub ViTBackbone (32x32 images, 8x8
  patches, 2 layers, hidden 32) and a Dense softmax head on its tokens'
  mean (a Reshape with a -1 beside the 0); loads with `--import keras_hub`.
* `feature_space`: the structured-data tutorial's pattern, a Keras
  FeatureSpace without crosses (StringLookup, IntegerLookup, Normalization,
  concatenated) adapted on a small table, then Dense layers; the model
  takes the dict of raw features (FusedGemm "Dimension mismatch" on 0 rows).

Each builder saves the model and an .npz (one key per input, labels `y`,
training rows `*_train`) and returns their paths. `batch_pooled_bilstm` is
the one file mpconvert still cannot serve 0 rows of: its output is not
per-row, so the file is not padded, and its LSTM op aborts ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROWS, TRAIN = 240, 160


def _split(path: Path, inputs: dict[str, np.ndarray], y: np.ndarray) -> Path:
    arrays = {k: v[TRAIN:] for k, v in inputs.items()} | {"y": y[TRAIN:]}
    arrays |= {f"{k}_train": v[:TRAIN] for k, v in inputs.items()} | {"y_train": y[:TRAIN]}
    np.savez(path, **arrays)
    return path


def spam_tokens(vocab: int, maxlen: int, rows: int = ROWS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token ids zero-padded at the end, as a tokenizer's pad_sequences leaves them; spam when token 1 occurs."""
    rng = np.random.default_rng(seed)
    x = np.zeros((rows, maxlen), np.int32)
    for i, length in enumerate(rng.integers(3, maxlen, rows)):
        x[i, :length] = rng.integers(2, vocab, length)
    spam = rng.random(rows) < 0.4
    x[spam, 0] = 1
    return x, spam.astype(np.float32)


def spam_bilstm_h5(folder: Path, vocab: int = 1000, maxlen: int = 50, units: int = 16, epochs: int = 2):
    """(model.h5, data.npz): the tf-keras spam classifier; input "tokens" int32 (n, maxlen), output P(spam)."""
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    tokens = tf_keras.Input((maxlen,), dtype="int32", name="tokens")
    x = tf_keras.layers.Embedding(vocab, 32, name="embed")(tokens)
    x = tf_keras.layers.Bidirectional(tf_keras.layers.LSTM(units), name="bilstm")(x)
    x = tf_keras.layers.Dense(16, activation="relu", name="hidden")(x)
    spam = tf_keras.layers.Dense(1, activation="sigmoid", name="spam")(x)
    model = tf_keras.Model(tokens, spam, name="sms_spam")
    model.compile(optimizer=tf_keras.optimizers.Adam(1e-2), loss="binary_crossentropy")
    x_all, y = spam_tokens(vocab, maxlen)
    model.fit(x_all[:TRAIN], y[:TRAIN], epochs=epochs, batch_size=32, verbose=0)
    path = Path(folder) / "spam.h5"
    model.save(path)
    return path, _split(Path(folder) / "spam.npz", {"tokens": x_all}, y)


def masking_lstm(folder: Path, steps: int = 6, features: int = 4, epochs: int = 3):
    """(model.keras, data.npz): Sequential Masking(0) + LSTM(8) + Dense softmax over 3 classes; input (n, steps, 4)."""
    import keras

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(ROWS, steps, features)).astype(np.float32)
    for i, length in enumerate(rng.integers(2, steps + 1, ROWS)):
        x[i, length:] = 0.0  # padded steps, which the mask skips
    y = np.digitize(x[:, 0, 0] + x[:, 1, 1], [-0.5, 0.5]).astype(np.int64)
    model = keras.Sequential(
        [
            keras.Input((steps, features)),
            keras.layers.Masking(0.0),
            keras.layers.LSTM(8),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    model.fit(x[:TRAIN], y[:TRAIN], epochs=epochs, batch_size=32, verbose=0)
    path = Path(folder) / "masking_lstm.keras"
    model.save(path)
    return path, _split(Path(folder) / "masking_lstm.npz", {"x": x}, y)


def vit_classifier(folder: Path, epochs: int = 1):
    """(model.keras, data.npz): ViTBackbone (32x32x3, patch 8, 2 layers, hidden 32), its tokens averaged, Dense(4)."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64
    )
    images = keras.Input((32, 32, 3), name="images")
    tokens = backbone(images)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(tokens)
    logits = keras.layers.Dense(4, activation="softmax", name="label")(pooled)
    model = keras.Model(images, logits, name="vit_classifier")
    rng = np.random.default_rng(2)
    x = rng.random((ROWS, 32, 32, 3)).astype(np.float32)
    y = (x[:, :16].mean(axis=(1, 2, 3)) > x[:, 16:].mean(axis=(1, 2, 3))).astype(np.int64) * 2 + (
        x[..., 0].mean(axis=(1, 2)) > 0.5
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    model.fit(x[:TRAIN], y[:TRAIN], epochs=epochs, batch_size=32, verbose=0)
    path = Path(folder) / "vit.keras"
    model.save(path)
    return path, _split(Path(folder) / "vit.npz", {"images": x}, y)


COLORS = ("red", "green", "blue", "black")


def feature_table(rows: int = ROWS, seed: int = 3) -> dict[str, np.ndarray]:
    """color (string), rooms (int64) and area (float32), each (n, 1), and `y` from all three."""
    rng = np.random.default_rng(seed)
    color = np.array(COLORS)[rng.integers(0, len(COLORS), rows)].reshape(rows, 1)
    rooms = rng.integers(1, 6, rows).astype(np.int64).reshape(rows, 1)
    area = (rng.normal(size=(rows, 1)) * 30 + 90).astype(np.float32)
    y = ((color[:, 0] == "red") ^ (rooms[:, 0] > 3) ^ (area[:, 0] > 90)).astype(np.int64)
    return {"color": color, "rooms": rooms, "area": area, "y": y}


def feature_space(folder: Path, epochs: int = 5):
    """(model.keras, data.npz): FeatureSpace(string, integer categorical, float normalized) -> Dense(32) -> Dense(1)."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    table = feature_table()
    features = {k: v for k, v in table.items() if k != "y"}
    space = keras.utils.FeatureSpace(
        features={
            "color": keras.utils.FeatureSpace.string_categorical(num_oov_indices=1),
            "rooms": keras.utils.FeatureSpace.integer_categorical(num_oov_indices=1),
            "area": keras.utils.FeatureSpace.float_normalized(),
        },
        output_mode="concat",
    )
    space.adapt(tf.data.Dataset.from_tensor_slices({k: v[:TRAIN] for k, v in features.items()}).batch(32))
    encoded_inputs = space.get_encoded_features()
    hidden = keras.layers.Dense(32, activation="relu", name="hidden")(encoded_inputs)
    out = keras.layers.Dense(1, activation="sigmoid", name="target")(hidden)
    trainer = keras.Model(encoded_inputs, out)
    trainer.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy")
    encoded = space({k: tf.constant(v[:TRAIN]) for k, v in features.items()})
    trainer.fit(encoded, table["y"][:TRAIN].astype(np.float32), epochs=epochs, batch_size=32, verbose=0)
    # The tutorial's inference model: the encoded features are computed from the raw inputs in its graph.
    model = keras.Model(space.get_inputs(), out, name="feature_space_model")
    path = Path(folder) / "feature_space.keras"
    model.save(path)
    return path, _split(Path(folder) / "feature_space.npz", features, table["y"].astype(np.int64))


def batch_pooled_bilstm(folder: Path, vocab: int = 50, maxlen: int = 8, units: int = 4) -> Path:
    """A tf-keras .h5: `spam_bilstm_h5`'s Embedding + Bidirectional(LSTM), then the mean over the batch, (1, 8).

    Its one output is not one row per input row (its first dimension is
    fixed at 1), so the ONNX file is not padded for an empty batch, and its
    LSTM op meets 0 rows: ONNX Runtime 1.31 calls std::terminate.
    """
    import tensorflow as tf
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    tokens = tf_keras.Input((maxlen,), dtype="int32", name="tokens")
    x = tf_keras.layers.Embedding(vocab, 8, name="embed")(tokens)
    x = tf_keras.layers.Bidirectional(tf_keras.layers.LSTM(units), name="bilstm")(x)
    pooled = tf.reduce_mean(x, axis=0, keepdims=True)  # a TFOpLambda layer: saved by name, no code
    path = Path(folder) / "pooled.h5"
    tf_keras.Model(tokens, pooled, name="batch_pooled").save(path)
    return path
