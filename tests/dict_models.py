"""Models whose inputs (and outputs) are dicts, and labelled data for them, built by committed code.

`tokens_and_num`: inputs {"tokens": int32 (n, 4), "num": float32 (n, 6)}
into an Embedding and a Dense, a 3-class softmax "label". With
`names="other"` the Input layers are named differently from the dict keys
("tok_ids", "numbers"), as users write them; with `outputs="dict"` the model
also has a regression head: outputs {"score": ..., "label": ...}, built in
that order while Keras sorts the output names; `outputs="keys"` keys them
"s" and "l", unlike the layers' names.

The labels are a function of the inputs, learnt well in a few epochs on a
few hundred rows, so an accuracy drift is a real figure.
"""

from __future__ import annotations

import numpy as np

VOCAB = 20
ROWS = 400


def data(rows: int = ROWS, seed: int = 0) -> dict[str, np.ndarray]:
    """tokens, num, and the targets: label (0-2) and score (float)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=(rows, 4)).astype(np.int32)
    num = rng.standard_normal((rows, 6)).astype(np.float32)
    signal = num[:, :3].sum(axis=1) + (tokens[:, 0] >= VOCAB // 2) * 2.0 - 1.0
    label = np.digitize(signal, [-1.0, 1.0]).astype(np.int64)
    score = (num[:, :2].sum(axis=1, keepdims=True) + tokens[:, :1] / VOCAB).astype(np.float32)
    return {"tokens": tokens, "num": num, "label": label, "score": score}


def tokens_and_num(K, names: str = "same", outputs: str = "one", seed: int = 0, epochs: int = 15):
    """The model, trained on `data()`'s first 300 rows."""
    K.utils.set_random_seed(seed)
    tok_name, num_name = ("tokens", "num") if names == "same" else ("tok_ids", "numbers")
    tokens = K.Input((4,), dtype="int32", name=tok_name)
    num = K.Input((6,), name=num_name)
    embedded = K.layers.Flatten(name="flat")(K.layers.Embedding(VOCAB, 8, name="embed")(tokens))
    dense = K.layers.Dense(16, activation="relu", name="num_dense")(num)
    joined = K.layers.Concatenate(name="join")([embedded, dense])
    trunk = K.layers.Dense(30, activation="relu", name="trunk")(joined)  # 30: padded to 32 under x8
    label = K.layers.Dense(3, activation="softmax", name="label")(trunk)
    heads: object = label
    if outputs in ("dict", "keys"):
        score = K.layers.Dense(1, name="score")(trunk)
        # "keys": dict keys unlike the output layers' names, which name the outputs.
        heads = {"score": score, "label": label} if outputs == "dict" else {"s": score, "l": label}
    model = K.Model({"tokens": tokens, "num": num}, heads, name=f"tokens_and_num_{names}_{outputs}")
    d = data()
    x = {"tokens": d["tokens"][:300], "num": d["num"][:300]}
    if outputs in ("dict", "keys"):
        label_key, score_key = ("label", "score") if outputs == "dict" else ("l", "s")
        model.compile(
            optimizer=K.optimizers.Adam(1e-2), loss={label_key: "sparse_categorical_crossentropy", score_key: "mse"}
        )
        y: object = {label_key: d["label"][:300], score_key: d["score"][:300]}
    else:
        model.compile(optimizer=K.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
        y = d["label"][:300]
    model.fit(x, y, epochs=epochs, batch_size=32, verbose=0)
    return model


def npz(path, outputs: str = "one", keys: tuple[str, str] = ("tokens", "num"), with_train: bool = True):
    """The validation rows (300-400) and the train rows (0-300), inputs under `keys`."""
    d = data()
    arrays = {keys[0]: d["tokens"][300:], keys[1]: d["num"][300:]}
    labels = {"y": d["label"]} if outputs == "one" else {"y_label": d["label"], "y_score": d["score"]}
    arrays.update({k: v[300:] for k, v in labels.items()})
    if with_train:
        arrays.update({keys[0] + "_train": d["tokens"][:300], keys[1] + "_train": d["num"][:300]})
        arrays.update({k + "_train": v[:300] for k, v in labels.items()})
    np.savez(path, **arrays)
    return path
