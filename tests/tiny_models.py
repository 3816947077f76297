"""Tiny models for the tests, built by committed code (no downloads).

Each builder takes the framework module (`keras` or `tf_keras`) so the same
architecture is exercised through both code paths.
"""

from __future__ import annotations

import numpy as np


def mlp(K, inputs: int = 8, classes: int = 3, activation: str = "softmax", name: str = "mlp"):
    x = K.Input((inputs,), name="features")
    h = K.layers.Dense(16, activation="relu", name="hidden")(x)
    out = K.layers.Dense(classes, activation=activation, name="predictions")(h)
    return K.Model(x, out, name=name)


def regression(K, inputs: int = 8):
    x = K.Input((inputs,), name="features")
    h = K.layers.Dense(16, activation="relu", name="hidden")(x)
    out = K.layers.Dense(1, name="value")(h)
    return K.Model(x, out, name="regression")


def nested(K):
    """A Sequential inside a Functional, the Sequential producing the output."""
    x = K.Input((8,), name="features")
    h = K.layers.Dense(16, activation="relu", name="stem")(x)
    head = K.Sequential(
        [
            K.layers.Dense(12, activation="relu", name="head_hidden"),
            K.layers.Dense(4, activation="softmax", name="head_out"),
        ],
        name="head",
    )
    return K.Model(x, head(h), name="nested")


def recurrent(K, vocab: int = 50, steps: int = 12):
    ids = K.Input((steps,), dtype="int32", name="ids")
    e = K.layers.Embedding(vocab, 16, name="embed")(ids)
    h = K.layers.LSTM(16, name="lstm")(e)
    h = K.layers.Dense(8, activation="relu", name="hidden")(h)
    out = K.layers.Dense(3, activation="softmax", name="predictions")(h)
    return K.Model(ids, out, name="recurrent")


def lambda_model(K):
    x = K.Input((4,), name="features")
    h = K.layers.Lambda(lambda t: t * 2.0, name="double")(x)
    return K.Model(x, K.layers.Dense(2, name="out")(h), name="with_lambda")


def classification_data(rows: int, inputs: int, classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, inputs)).astype(np.float32)
    y = rng.integers(0, classes, size=rows)
    return x, y


def float16_overflow(K, seed: int = 0):
    """A classifier that is exact in float32 but overflows float16.

    The hidden layer's weights are scaled by 1e4 and the output layer's by
    1e-4, so float32 logits are unchanged in effect while the hidden
    activations (|h| ~ 1e4..1e5) exceed float16's maximum of 65504 and become
    inf, which turns the softmax into NaN. bfloat16 has float32's exponent
    range and is unaffected.
    """
    model = mlp(K, inputs=8, classes=3, name="overflow")
    rng = np.random.default_rng(seed)
    hidden = model.get_layer("hidden")
    out = model.get_layer("predictions")
    hidden.set_weights([rng.standard_normal((8, 16)).astype("float32") * 3e4, np.zeros(16, "float32")])
    out.set_weights([rng.standard_normal((16, 3)).astype("float32") * 1e-4, np.zeros(3, "float32")])
    return model


def gradient_overflow(K, seed: int = 0):
    """A regressor whose forward pass is fine in float16 but whose gradients are not.

    The float32 output layer has weights ~3e5, so the gradient flowing back
    into the 16-bit hidden layer is ~1e10 even before loss scaling: above
    float16's 65504 at any scale, so every step is skipped and a dynamic loss
    scale halves all the way down to 1.
    """
    model = regression(K)
    rng = np.random.default_rng(seed)
    model.get_layer("value").set_weights([rng.standard_normal((16, 1)).astype("float32") * 3e5, np.zeros(1, "float32")])
    return model


def unfriendly(K):
    """Every kind of dimension issue 4 names: 30 input features, Dense(100),
    Conv2D(30), a Flatten into the head and a 10-way softmax output."""
    x = K.Input((30,), name="features")
    h = K.layers.Dense(100, activation="relu", name="dense100")(x)
    h = K.layers.Dense(64, activation="relu", name="dense64")(h)
    h = K.layers.Reshape((8, 8, 1), name="to_image")(h)
    c = K.layers.Conv2D(30, 3, padding="same", name="conv30")(h)
    c = K.layers.BatchNormalization(name="bn30")(c)
    c = K.layers.ReLU(name="relu30")(c)
    c = K.layers.MaxPooling2D(name="pool")(c)
    f = K.layers.Flatten(name="flatten")(c)
    out = K.layers.Dense(10, activation="softmax", name="predictions")(f)
    return K.Model(x, out, name="unfriendly")


def layernorm_after_dense(K):
    x = K.Input((32,), name="features")
    h = K.layers.Dense(100, name="dense100")(x)
    h = K.layers.LayerNormalization(name="ln")(h)
    out = K.layers.Dense(4, activation="softmax", name="predictions")(h)
    return K.Model(x, out, name="with_layernorm")


def separable_data(rows: int, inputs: int = 8, classes: int = 3, seed: int = 0):
    """Rows whose class is the largest of their first `classes` features: a linear model learns it."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, inputs)).astype(np.float32)
    return x, x[:, :classes].argmax(axis=1)


def compiled_classifier(K, loss, logits: bool = False, classes: int = 3, seed: int = 0):
    """`mlp` trained on `separable_data` with `loss` (a name or a Loss), as a user saves it compiled.

    The targets are one-hot rows unless the loss is a sparse one; `logits`
    ends the model in a plain Dense (no softmax), as models trained with
    `from_logits=True` do.
    """
    K.utils.set_random_seed(seed)
    model = mlp(K, classes=classes, activation=None if logits else "softmax", name="logits" if logits else "mlp")
    x, y = separable_data(600, 8, classes, seed)
    sparse = "sparse" in (loss if isinstance(loss, str) else type(loss).__name__).lower()
    model.compile(optimizer=K.optimizers.Adam(1e-2), loss=loss)
    model.fit(x, y if sparse else np.eye(classes, dtype=np.float32)[y], epochs=20, batch_size=32, verbose=0)
    return model


def classifier_npz(path, one_hot: bool, classes: int = 3, seed: int = 1):
    """`separable_data` rows for `compiled_classifier`: labels as class ids (n,) or one-hot rows (n, classes)."""
    x, y = separable_data(600, 8, classes, seed)
    labels = np.eye(classes, dtype=np.float32)[y] if one_hot else y
    np.savez(path, x=x[:200], y=labels[:200], x_train=x[200:], y_train=labels[200:])
    return path
