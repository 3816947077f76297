"""Build the small sample models shipped with mpconvert.

Run from the repository root:

    .venv/bin/python sample_models/build.py

Writes:
    sample_models/data/digits.npz         (x, y, x_train, y_train)
    sample_models/data/breast_cancer.npz  (x, y, x_train, y_train)
    sample_models/digits_mlp/             Keras-2 SavedModel (tf_keras)
    sample_models/digits_cnn.keras        Keras 3
    sample_models/cancer_mlp.keras        Keras 3

The data comes from datasets bundled inside scikit-learn, so building needs
no network access. Everything is seeded and TensorFlow op determinism is on,
so two runs give identical weights and accuracies (file bytes may still
differ through embedded timestamps).
"""

import os
import shutil
import sys
import time
from pathlib import Path

# Must be set before TensorFlow is imported, or the C++ logging is already on.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# oneDNN picks kernels by CPU feature set; the plain Eigen kernels make the
# trained weights less dependent on which machine rebuilds the samples.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
# The .keras files must be real Keras 3 / TensorFlow files whatever the
# caller's environment says.
os.environ["KERAS_BACKEND"] = "tensorflow"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402
from sklearn.datasets import load_breast_cancer, load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

SEED = 1234
TEST_SIZE = 0.25

HERE = Path(__file__).resolve().parent
DATA_DIR = HERE / "data"
DIGITS_NPZ = DATA_DIR / "digits.npz"
CANCER_NPZ = DATA_DIR / "breast_cancer.npz"
DIGITS_MLP = HERE / "digits_mlp"
DIGITS_CNN = HERE / "digits_cnn.keras"
CANCER_MLP = HERE / "cancer_mlp.keras"

# Floors the build must reach; a silent regression in a sample model would
# make conversion-accuracy tests downstream meaningless.
MIN_ACC = {"digits_mlp": 0.95, "digits_cnn": 0.95, "cancer_mlp": 0.94}


def seed_everything():
    # Reseeded before each model so every model's result is independent of
    # how many random numbers earlier models consumed.
    np.random.seed(SEED)
    keras.utils.set_random_seed(SEED)
    tf_keras.utils.set_random_seed(SEED)


def write_npz(path, x_train, y_train, x_test, y_test):
    np.savez_compressed(
        path,
        x=x_test.astype(np.float32),
        y=y_test.astype(np.int64),
        x_train=x_train.astype(np.float32),
        y_train=y_train.astype(np.int64),
    )


def make_digits():
    ds = load_digits()
    # Raw pixels are integers 0..16; scaling keeps inputs in [0, 1].
    x = (ds.data / 16.0).astype(np.float32)
    y = ds.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=TEST_SIZE, stratify=y, random_state=SEED)
    write_npz(DIGITS_NPZ, x_train, y_train, x_test, y_test)


def make_breast_cancer():
    ds = load_breast_cancer()
    x = ds.data.astype(np.float64)
    # scikit-learn codes 0 = malignant, 1 = benign; flipped so that class 1
    # is what the model's sigmoid output (named "malignant") predicts.
    y = (1 - ds.target).astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=TEST_SIZE, stratify=y, random_state=SEED)
    # Statistics from the train split only, so nothing about the test set
    # leaks into the model's inputs.
    mean = x_train.mean(axis=0)
    std = x_train.std(axis=0)
    write_npz(CANCER_NPZ, (x_train - mean) / std, y_train, (x_test - mean) / std, y_test)


def load_npz(path):
    with np.load(path) as d:
        return {k: d[k] for k in d.files}


def accuracy(probs, y):
    probs = np.asarray(probs)
    if probs.shape[-1] == 1:
        pred = (probs[:, 0] > 0.5).astype(np.int64)
    else:
        pred = probs.argmax(axis=-1)
    return float((pred == y).mean())


def remove(path):
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def build_digits_mlp(d):
    seed_everything()
    L = tf_keras.layers
    inputs = L.Input(shape=(64,))
    h = L.Dense(64, activation="relu", name="hidden1")(inputs)
    h = L.Dense(32, activation="relu", name="hidden2")(h)
    outputs = L.Dense(10, activation="softmax", name="predictions")(h)
    model = tf_keras.Model(inputs, outputs, name="digits_mlp")
    # Keyword arguments so the compile config (loss, metrics) is serialised
    # into keras_metadata.pb and survives load_model.
    model.compile(
        optimizer=tf_keras.optimizers.Adam(learning_rate=1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    model.fit(d["x_train"], d["y_train"], epochs=60, batch_size=32, shuffle=True, verbose=0)
    acc = accuracy(model.predict(d["x"], verbose=0), d["y"])
    remove(DIGITS_MLP)
    model.save(str(DIGITS_MLP), save_format="tf")
    return acc


def build_digits_cnn(d):
    seed_everything()
    L = keras.layers
    inputs = keras.Input(shape=(64,), name="pixels")
    # Flat input so the MLP and the CNN share one data file.
    h = L.Reshape((8, 8, 1))(inputs)
    h = L.Conv2D(16, 3, padding="same", name="conv1")(h)
    h = L.BatchNormalization(name="bn1")(h)
    h = L.ReLU()(h)
    h = L.MaxPooling2D()(h)
    h = L.Conv2D(30, 3, padding="same", activation="relu", name="conv2")(h)
    h = L.Flatten()(h)
    outputs = L.Dense(10, activation="softmax", name="predictions")(h)
    model = keras.Model(inputs, outputs, name="digits_cnn")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    model.fit(d["x_train"], d["y_train"], epochs=30, batch_size=32, shuffle=True, verbose=0)
    acc = accuracy(model.predict(d["x"], verbose=0), d["y"])
    remove(DIGITS_CNN)
    model.save(str(DIGITS_CNN))
    return acc


def build_cancer_mlp(d):
    seed_everything()
    L = keras.layers
    inputs = keras.Input(shape=(30,), name="features")
    h = L.Dense(32, activation="relu", name="hidden")(inputs)
    outputs = L.Dense(1, activation="sigmoid", name="malignant")(h)
    model = keras.Model(inputs, outputs, name="cancer_mlp")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=1e-3),
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )
    # Labels are 0/1 class ids; binary cross-entropy wants a float column.
    model.fit(
        d["x_train"], d["y_train"].astype(np.float32).reshape(-1, 1), epochs=40, batch_size=32, shuffle=True, verbose=0
    )
    acc = accuracy(model.predict(d["x"], verbose=0), d["y"])
    remove(CANCER_MLP)
    model.save(str(CANCER_MLP))
    return acc


def reload_accuracy(name, d):
    # Check the written files, not the in-memory models: a file that does not
    # round-trip is useless as a sample.
    if name == "digits_mlp":
        model = tf_keras.models.load_model(str(DIGITS_MLP))
        if not isinstance(model, tf_keras.Model):
            raise RuntimeError("digits_mlp did not load as a tf_keras Model")
    else:
        path = DIGITS_CNN if name == "digits_cnn" else CANCER_MLP
        model = keras.models.load_model(str(path))  # safe_mode stays on
    return accuracy(model.predict(d["x"], verbose=0), d["y"])


def size_of(path):
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def main():
    start = time.perf_counter()
    # Predicting with several fresh models triggers harmless retracing
    # warnings that would bury the summary table.
    tf.get_logger().setLevel("ERROR")
    tf.config.experimental.enable_op_determinism()
    DATA_DIR.mkdir(parents=True, exist_ok=True)

    make_digits()
    make_breast_cancer()
    digits = load_npz(DIGITS_NPZ)
    cancer = load_npz(CANCER_NPZ)

    built = [
        ("digits_mlp", DIGITS_MLP, digits, build_digits_mlp(digits)),
        ("digits_cnn", DIGITS_CNN, digits, build_digits_cnn(digits)),
        ("cancer_mlp", CANCER_MLP, cancer, build_cancer_mlp(cancer)),
    ]

    failures = []
    rows = []
    for name, path, d, acc in built:
        reloaded = reload_accuracy(name, d)
        if reloaded != acc:
            failures.append(f"{name}: accuracy {acc:.4f} after build but {reloaded:.4f} after reload")
        if acc < MIN_ACC[name]:
            failures.append(f"{name}: test accuracy {acc:.4f} below {MIN_ACC[name]}")
        rows.append((name, path.relative_to(HERE.parent), size_of(path), acc, reloaded))
    for path in (DIGITS_NPZ, CANCER_NPZ):
        rows.append((path.stem + " data", path.relative_to(HERE.parent), size_of(path), None, None))

    print(f"{'model':<18} {'file':<36} {'bytes':>9} {'test acc':>9} {'reloaded':>9}")
    for name, rel, size, acc, reloaded in rows:
        a = "" if acc is None else f"{acc:.4f}"
        r = "" if reloaded is None else f"{reloaded:.4f}"
        print(f"{name:<18} {str(rel):<36} {size:>9} {a:>9} {r:>9}")
    print(f"built in {time.perf_counter() - start:.1f}s")

    if failures:
        for f in failures:
            print("FAIL:", f, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
