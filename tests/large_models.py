"""Dense stacks for the large-model path: a tiny one for the fast tests (its threshold lowered to bytes), and
the 2.2 GB one of the user report for `--full` (553.8M parameters: over protobuf's 2 GiB as float32)."""

WIDE = (10240, 8192, 8)  # inputs, units per layer, layers: 2.22 GB of float32 weights


def dense_stack(K, inputs: int = 16, width: int = 32, layers: int = 2, classes: int = 4):
    x = K.Input((inputs,), name="x")
    h = x
    for i in range(layers):
        h = K.layers.Dense(width, activation="relu", name=f"dense_{i}")(h)
    return K.Model(x, K.layers.Dense(classes, activation="softmax", name="probs")(h))


def weight_bytes(model) -> int:
    return sum(int(w.numpy().nbytes) for w in model.weights)
