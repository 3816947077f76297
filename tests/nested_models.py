"""Models with layers inside layers, with data to convert them.

`sequential_inside`: a Sequential inside a Functional model (its config lists the inner layers).
`tiny_bert`: a keras-hub BertBackbone (2 blocks, 2 heads, hidden 64) built from its config, random weights,
in a Functional model with a Dense softmax head on its pooled output; its config lists none of its own
layers, and each block's MultiHeadAttention holds a Softmax. Saved as .keras, it loads with `import keras_hub`.
"""

from __future__ import annotations

import numpy as np

BERT_INPUTS = ("token_ids", "segment_ids", "padding_mask")
SEQUENCE = 32


def sequential_inside():
    import keras

    keras.utils.set_random_seed(0)
    block = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="d1"), keras.layers.Dense(8, name="d2")],
        name="block",
    )
    x = keras.Input((8,), name="x")
    return keras.Model(x, keras.layers.Dense(3, activation="softmax", name="head")(block(x)))


def tiny_bert(path, seed: int = 0):
    import keras
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=100,
        num_layers=2,
        num_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
        max_sequence_length=SEQUENCE,
    )
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in BERT_INPUTS}
    head = keras.layers.Dense(3, activation="softmax", name="head")(backbone(inputs)["pooled_output"])
    keras.Model(inputs, head).save(str(path))
    return path


def bert_rows(n: int = 128, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids of random lengths (4 to 32) padded with 0, their mask, one segment; labels from the first token."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, SEQUENCE + 1, size=n)
    mask = (np.arange(SEQUENCE)[None, :] < lengths[:, None]).astype(np.int32)
    tokens = (rng.integers(1, 100, size=(n, SEQUENCE)) * mask).astype(np.int32)
    return {
        "token_ids": tokens,
        "segment_ids": np.zeros((n, SEQUENCE), np.int32),
        "padding_mask": mask,
        "y": (tokens[:, 0] % 3).astype(np.int64),
    }


def bert_npz(path, n: int = 128):
    np.savez(path, **bert_rows(n))
    return path
