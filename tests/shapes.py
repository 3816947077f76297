"""Models with the shapes real zoos have, built by committed code (no downloads).

Preprocessing layers adapted to raw data, lookups and bins on integer codes,
containers nested two levels deep, a tower used twice, a layer called three
times, a layer with several outputs, and a regression whose hidden values
overflow float16. Builders take the framework module (`keras` or `tf_keras`)
where both can build the shape, so each is exercised through both code paths.
"""

from __future__ import annotations

import numpy as np

RAW_SCALE = 3e5  # raw sensor-like values: beyond float16's 65504


def raw_features(rows: int = 512, width: int = 6, seed: int = 0):
    """Inputs around 3e5 with a class that depends on their small deviations."""
    rng = np.random.default_rng(seed)
    deviation = rng.standard_normal((rows, width)).astype(np.float32)
    x = (RAW_SCALE + 2e4 * deviation).astype(np.float32)
    y = (deviation[:, 0] + deviation[:, 1] > 0).astype(np.int64) + (deviation[:, 2] > 1).astype(np.int64)
    return x, y


def train(model, x, y, epochs: int = 30, loss: str = "sparse_categorical_crossentropy"):
    model.compile(optimizer="adam", loss=loss)
    model.fit(x, y, epochs=epochs, batch_size=64, verbose=0)
    return model


def coded_data(rows: int = 512, seed: int = 0):
    """Integer codes (sparse ids in 100..160) and an amount, with a class from both."""
    rng = np.random.default_rng(seed)
    codes = rng.choice(np.arange(100, 160, 3), size=(rows, 1)).astype(np.int64)
    amount = rng.standard_normal((rows, 1)).astype(np.float32)
    y = ((codes[:, 0] % 2 == 0) ^ (amount[:, 0] > 0.3)).astype(np.int64)
    return codes, amount, y


def pixels(rows: int, width: int = 16, seed: int = 0):
    return np.random.default_rng(seed).uniform(0, 255, (rows, width)).astype(np.float32)


def preprocessing_zoo(K, x, codes, amount):
    """Every numeric preprocessing layer in one model, each adapted to or fed raw data.

    An adapted Normalization on ~3e5 raw features, IntegerLookup and
    Discretization adapted to codes and amounts, Hashing of the codes, each
    one-hot encoded with CategoryEncoding, and Rescaling of 0..255 pixels.
    """
    norm = K.layers.Normalization(name="norm")
    norm.adapt(x)
    lookup = K.layers.IntegerLookup(name="lookup")
    lookup.adapt(codes)
    bins = K.layers.Discretization(num_bins=4, name="bins")
    bins.adapt(amount)
    features = K.Input((x.shape[1],), name="features")
    code_in = K.Input((1,), dtype="int64", name="codes")
    amount_in = K.Input((1,), name="amount")
    pixel_in = K.Input((16,), name="pixels")
    branches = [
        norm(features),
        K.layers.CategoryEncoding(num_tokens=lookup.vocabulary_size(), output_mode="one_hot", name="code_hot")(
            lookup(code_in)
        ),
        K.layers.CategoryEncoding(num_tokens=4, output_mode="one_hot", name="bin_hot")(bins(amount_in)),
        K.layers.CategoryEncoding(num_tokens=8, output_mode="one_hot", name="hash_hot")(
            K.layers.Hashing(8, name="hash")(code_in)
        ),
        K.layers.Rescaling(1 / 255.0, name="rescale")(pixel_in),
    ]
    h = K.layers.Dense(16, activation="relu", name="hidden")(K.layers.Concatenate(name="joined")(branches))
    out = K.layers.Dense(3, activation="softmax", name="predictions")(h)
    return K.Model([features, code_in, amount_in, pixel_in], out, name="preprocessing_zoo")


def nested_autoencoder(K, width: int = 64):
    """A Sequential encoder and decoder inside a Sequential (the classic tf.keras 2.x autoencoder)."""
    encoder = K.Sequential(
        [
            K.Input((width,)),
            K.layers.Dense(32, activation="relu", name="enc_1"),
            K.layers.Dense(8, activation="relu", name="code"),
        ],
        name="encoder",
    )
    decoder = K.Sequential(
        [
            K.Input((8,)),
            K.layers.Dense(32, activation="relu", name="dec_1"),
            K.layers.Dense(width, activation="sigmoid", name="pixels"),
        ],
        name="decoder",
    )
    return K.Sequential([K.Input((width,)), encoder, decoder], name="autoencoder")


def two_levels(K, inputs: int = 8, classes: int = 3):
    """A Functional backbone holding a Sequential block, inside a Functional model."""
    block = K.Sequential([K.Input((16,)), K.layers.Dense(16, activation="relu", name="block_dense")], name="block")
    x_in = K.Input((inputs,), name="backbone_in")
    h = K.layers.Dense(16, activation="relu", name="stem")(x_in)
    backbone = K.Model(x_in, block(h), name="backbone")
    x = K.Input((inputs,), name="features")
    out = K.layers.Dense(classes, activation="softmax", name="predictions")(backbone(x))
    return K.Model(x, out, name="two_levels")


def shared_tower(K, inputs: int = 8):
    """A siamese pair: one tower model applied to two inputs, and one Dense called three times."""
    t_in = K.Input((inputs,), name="tower_in")
    tower = K.Model(t_in, K.layers.Dense(12, activation="relu", name="tower_dense")(t_in), name="tower")
    a, b = K.Input((inputs,), name="left"), K.Input((inputs,), name="right")
    shared = K.layers.Dense(12, activation="relu", name="shared")
    ta, tb = tower(a), tower(b)
    joined = K.layers.Concatenate(name="joined")(
        [shared(ta), shared(tb), shared(K.layers.Subtract(name="gap")([ta, tb]))]
    )
    out = K.layers.Dense(3, activation="softmax", name="predictions")(joined)
    return K.Model([a, b], out, name="siamese")


def several_outputs(K, steps: int = 6, features: int = 4):
    """An LSTM returning its sequence and both states: one layer, three output tensors."""
    x = K.Input((steps, features), name="series")
    seq, h, c = K.layers.LSTM(8, return_sequences=True, return_state=True, name="lstm")(x)
    pooled = K.layers.GlobalAveragePooling1D(name="pool")(seq)
    joined = K.layers.Concatenate(name="joined")([pooled, h, c])
    out = K.layers.Dense(3, activation="softmax", name="predictions")(joined)
    return K.Model(x, out, name="lstm_states")


def overflowing_regression(K, seed: int = 0):
    """A regression exact in float32 whose hidden values (~1e5) overflow float16 to inf."""
    x = K.Input((4,), name="features")
    h = K.layers.Dense(4, name="pre", kernel_initializer="identity")(x)
    h = K.layers.Dense(8, name="big")(h)
    out = K.layers.Dense(1, name="value")(h)
    model = K.Model(x, out, name="overflow_regression")
    rng = np.random.default_rng(seed)
    model.get_layer("big").set_weights([rng.standard_normal((4, 8)).astype("float32") * 1e5, np.zeros(8, "float32")])
    model.get_layer("value").set_weights([rng.standard_normal((8, 1)).astype("float32") * 1e-5, np.zeros(1, "float32")])
    return model
