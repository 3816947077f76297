"""One small model that holds a Conv, an LSTM and an attention block, for the OpenVINO IR tests: one conversion
per policy covers all three (each conversion costs seconds of the suite's budget).

Token rows (graph_models.majority_tokens) -> Embedding -> Conv1D -> LSTM (whole sequence) -> MultiHeadAttention
with a residual and LayerNormalization -> pooling -> softmax, trained briefly so that its outputs are not the
near-uniform ones of random weights, where every difference looks like 0.
"""

from __future__ import annotations

from pathlib import Path

from graph_models import GROUPS, LENGTH, TOKENS, majority_tokens


def conv_lstm_attention(path: Path, seed: int = 0) -> Path:
    import keras

    keras.utils.set_random_seed(seed)
    tokens = keras.Input((LENGTH,), dtype="int32", name="tokens")
    embedded = keras.layers.Embedding(TOKENS, 16, name="emb")(tokens)
    convolved = keras.layers.Conv1D(16, 3, padding="same", activation="relu", name="conv")(embedded)
    recurrent = keras.layers.LSTM(16, return_sequences=True, name="lstm")(convolved)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8, name="mha")(recurrent, recurrent)
    hidden = keras.layers.LayerNormalization(name="norm")(keras.layers.Add()([recurrent, attended]))
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    model = keras.Model(tokens, keras.layers.Dense(GROUPS, activation="softmax", name="head")(pooled))
    x, y = majority_tokens(600, seed=5)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    model.fit(x, y, epochs=3, batch_size=64, verbose=0)
    model.save(str(path))
    return path
