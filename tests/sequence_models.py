"""Sequence models (one score per position: (batch, time, classes)) and their token data, built by committed code.

`gpt2`: a keras-hub GPT-2 backbone (2 layers, 64 wide, vocabulary 1000,
random weights, built from its config: no download) under a Dense(1000)
head, logits (no activation) or softmax, as a user puts a language-model
head on it; its inputs are the dict {"token_ids", "padding_mask"} of
(None, None) int32, its output (None, None, 1000). `gpt2_data`: rows of
varying length padded with id 0 (padding_mask 0 there), each row's labels
its next tokens.

`tagger`: Embedding(mask_zero=True) + GRU(return_sequences=True) +
Dense(4, softmax), trained a little on a rule it can learn (a token's tag
depends on it and the token before it), so its token accuracy means
something; id 0 is padding, which Keras masks and mpconvert leaves out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

GPT2_VOCAB = 1000
GPT2_LENGTH = 32
TAGGER_VOCAB = 12
TAGGER_TAGS = 4
TAGGER_LENGTH = 10


def lengths(rows: int, longest: int, rng: np.random.Generator) -> np.ndarray:
    """Each row's token count: between half and all of `longest`, so every row has tokens and most padding."""
    return rng.integers(longest // 2, longest + 1, size=rows)


def gpt2(K, head: str = "logits", seed: int = 0):
    """The GPT-2 backbone with a Dense(vocabulary) head: "logits" (no activation) or "softmax"."""
    import keras_hub

    K.utils.set_random_seed(seed)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=GPT2_VOCAB,
        num_layers=2,
        num_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
        max_sequence_length=GPT2_LENGTH,
    )
    token_ids = K.Input((None,), dtype="int32", name="token_ids")
    padding_mask = K.Input((None,), dtype="int32", name="padding_mask")
    hidden = backbone({"token_ids": token_ids, "padding_mask": padding_mask})
    activation = None if head == "logits" else "softmax"
    scores = K.layers.Dense(GPT2_VOCAB, activation=activation, name=f"lm_{head}")(hidden)
    return K.Model({"token_ids": token_ids, "padding_mask": padding_mask}, scores, name=f"gpt2_{head}")


def gpt2_data(rows: int = 24, seed: int = 0, suffix: str = "") -> dict[str, np.ndarray]:
    """token_ids, padding_mask and y (the next token; the last real position's label is the id 0 after it)."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((rows, GPT2_LENGTH + 1), dtype=np.int32)
    for i, n in enumerate(lengths(rows, GPT2_LENGTH, rng)):
        tokens[i, :n] = rng.integers(1, GPT2_VOCAB, size=n)
    x, y = tokens[:, :-1], tokens[:, 1:]
    return {f"token_ids{suffix}": x, f"padding_mask{suffix}": (x != 0).astype(np.int32), f"y{suffix}": y}


def tags_of(tokens: np.ndarray) -> np.ndarray:
    """The rule the tagger learns: (token + the token before it) mod 4, the first token alone; 0 at padding."""
    before = np.concatenate([np.zeros_like(tokens[:, :1]), tokens[:, :-1]], axis=1)
    return np.where(tokens == 0, 0, (tokens + before) % TAGGER_TAGS)


def tagger_data(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (n, 10) padded with 0 at the end, and their tags."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((rows, TAGGER_LENGTH), dtype=np.int32)
    for i, n in enumerate(lengths(rows, TAGGER_LENGTH, rng)):
        tokens[i, :n] = rng.integers(1, TAGGER_VOCAB, size=n)
    return tokens, tags_of(tokens)


def tagger(K, seed: int = 0, epochs: int = 3):
    """The token tagger, trained `epochs` on 600 rows of `tagger_data` (about 0.95 token accuracy; 1.0 takes 5)."""
    K.utils.set_random_seed(seed)
    tokens = K.Input((TAGGER_LENGTH,), dtype="int32", name="tokens")
    embedded = K.layers.Embedding(TAGGER_VOCAB, 16, mask_zero=True, name="embed")(tokens)
    hidden = K.layers.GRU(32, return_sequences=True, name="gru")(embedded)
    tags = K.layers.Dense(TAGGER_TAGS, activation="softmax", name="tags")(hidden)
    model = K.Model(tokens, tags, name="tagger")
    model.compile(K.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
    x, y = tagger_data(600, seed + 1)
    model.fit(x, y, sample_weight=(x != 0).astype("float32"), epochs=epochs, batch_size=32, verbose=0)
    return model


def save_all(K, folder: Path) -> Path:
    """gpt2_logits.keras, gpt2_softmax.keras, tagger.keras and their data (.npz with a training split)."""
    folder.mkdir(parents=True, exist_ok=True)
    gpt2(K, "logits").save(folder / "gpt2_logits.keras")
    gpt2(K, "softmax").save(folder / "gpt2_softmax.keras")
    np.savez(folder / "gpt2.npz", **gpt2_data(24, 1), **gpt2_data(48, 2, "_train"))
    tagger(K).save(folder / "tagger.keras")
    x, y = tagger_data(120, 3)
    x_train, y_train = tagger_data(200, 4)
    np.savez(folder / "tagger.npz", x=x, y=y, x_train=x_train, y_train=y_train)
    return folder
