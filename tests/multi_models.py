"""Models with several outputs, and labelled data for them, built by committed code.

`digits_and_ink`: a digit classifier head ("digit", softmax over 10) and a
regression head ("ink", the image's total ink) on the sample digits data.
The ink head's hidden layer ("ink_hidden") computes 5000 x the ink, up to
1.35e5 on these images: beyond float16's largest value (65504) for most of
them, so under mixed_float16 that head turns inf/NaN while the digit head
is fine.
Built with dict outputs (in a different order from the sorted output names,
as users write them) or list outputs, in Keras 3 or tf-keras.

`two_classifiers`: two softmax heads over a shared trunk (the digit, and
whether it is odd).
"""

from __future__ import annotations

import numpy as np
from conftest import SAMPLES

INK_SCALE = 5000.0  # ink_hidden's weight: 5000 x the ink reaches 1.35e5 on the digits images


def digits() -> dict[str, np.ndarray]:
    with np.load(SAMPLES / "data" / "digits.npz", allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}


def ink(x: np.ndarray) -> np.ndarray:
    """The regression target: total ink per image, scaled to about 1."""
    return (x.sum(axis=1, keepdims=True) / 30.0).astype(np.float32)


def digits_and_ink(K, outputs: str = "dict", seed: int = 0, epochs: int = 30):
    """The classifier trained on the digits; the ink head exact by construction (no training needed)."""
    K.utils.set_random_seed(seed)
    x = K.Input((64,), name="pixels")
    trunk = K.layers.Dense(32, activation="relu", name="trunk")(x)
    digit = K.layers.Dense(10, activation="softmax", name="digit")(trunk)
    hidden = K.layers.Dense(4, activation="relu", name="ink_hidden")(x)
    ink_out = K.layers.Dense(1, name="ink")(hidden)
    heads = {"ink": ink_out, "digit": digit} if outputs == "dict" else [digit, ink_out]
    model = K.Model(x, heads, name=f"digits_and_ink_{outputs}")
    model.get_layer("ink_hidden").set_weights([np.full((64, 4), INK_SCALE, np.float32), np.zeros(4, np.float32)])
    # 4 units of 2000 x ink, summed and scaled back: exactly ink / 30.
    model.get_layer("ink").set_weights([np.full((4, 1), 1 / (4 * INK_SCALE * 30), np.float32), np.zeros(1, np.float32)])
    data = digits()
    loss = {"digit": "sparse_categorical_crossentropy", "ink": "mse"}
    model.compile(optimizer=K.optimizers.Adam(3e-3), loss=loss if outputs == "dict" else [loss["digit"], loss["ink"]])
    model.get_layer("ink_hidden").trainable = False
    model.get_layer("ink").trainable = False
    targets = {"digit": data["y_train"], "ink": ink(data["x_train"])}
    model.fit(
        data["x_train"],
        targets if outputs == "dict" else [targets["digit"], targets["ink"]],
        epochs=epochs,
        batch_size=64,
        verbose=0,
    )
    model.get_layer("ink_hidden").trainable = True
    model.get_layer("ink").trainable = True
    return model


def digits_and_ink_npz(path, with_train: bool = True, ink_labels: bool = True):
    """y_digit (and y_ink) for the validation split, and the train split's, as the data format names them."""
    data = digits()
    arrays = {"x": data["x"], "y_digit": data["y"]}
    if ink_labels:
        arrays["y_ink"] = ink(data["x"])
    if with_train:
        arrays.update(x_train=data["x_train"], y_digit_train=data["y_train"])
        if ink_labels:
            arrays["y_ink_train"] = ink(data["x_train"])
    np.savez(path, **arrays)
    return path


def two_classifiers(K, seed: int = 0, epochs: int = 30):
    K.utils.set_random_seed(seed)
    x = K.Input((64,), name="pixels")
    trunk = K.layers.Dense(32, activation="relu", name="trunk")(x)
    digit = K.layers.Dense(10, activation="softmax", name="digit")(trunk)
    odd = K.layers.Dense(2, activation="softmax", name="odd")(trunk)
    model = K.Model(x, [digit, odd], name="two_classifiers")
    model.compile(optimizer=K.optimizers.Adam(3e-3), loss=["sparse_categorical_crossentropy"] * 2)
    data = digits()
    model.fit(data["x_train"], [data["y_train"], data["y_train"] % 2], epochs=epochs, batch_size=64, verbose=0)
    return model


def boxes_target(x: np.ndarray) -> np.ndarray:
    """A 4-number regression target per image: the ink in each quarter of the 8x8 digit, scaled to about 1."""
    quarters = x.reshape(-1, 2, 4, 2, 4).sum(axis=(2, 4)).reshape(-1, 4)
    return (quarters / 16.0).astype(np.float32)


def detector(K, seed: int = 0, epochs: int = 20):
    """Three heads named as a detector's: `boxes` (regression, 4), `objectness` (sigmoid, 1), `cls` (softmax, 3).

    `cls` is the digit modulo 3 and `boxes` the ink per quarter (`boxes_target`);
    `objectness` is never labelled (trained on nothing), so it only ever gets a
    drift check.
    """
    K.utils.set_random_seed(seed)
    x = K.Input((64,), name="pixels")
    trunk = K.layers.Dense(32, activation="relu", name="trunk")(x)
    boxes = K.layers.Dense(4, name="boxes")(trunk)
    objectness = K.layers.Dense(1, activation="sigmoid", name="objectness")(trunk)
    cls = K.layers.Dense(3, activation="softmax", name="cls")(trunk)
    model = K.Model(x, {"boxes": boxes, "objectness": objectness, "cls": cls}, name="detector")
    model.compile(optimizer=K.optimizers.Adam(3e-3), loss={"boxes": "mse", "cls": "sparse_categorical_crossentropy"})
    data = digits()
    targets = {"boxes": boxes_target(data["x_train"]), "cls": data["y_train"] % 3}
    model.fit(data["x_train"], targets, epochs=epochs, batch_size=64, verbose=0)
    return model


def detector_npz(path, cls_key: str = "y_cls"):
    """Labels for `boxes` and `cls` (under `cls_key`, so a test can misspell it), none for `objectness`."""
    data = digits()
    arrays = {"x": data["x"], "y_boxes": boxes_target(data["x"]), cls_key: data["y"] % 3}
    arrays.update(x_train=data["x_train"], y_boxes_train=boxes_target(data["x_train"]))
    arrays[cls_key + "_train"] = data["y_train"] % 3
    np.savez(path, **arrays)
    return path
