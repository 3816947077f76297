"""The Softmax inside attention: in the 16-bit policy (what a conversion gives it) against float32.

A keras-hub BertBackbone (2 blocks, 2 heads, hidden 64, random weights, sequences of 4 to 32 tokens)
under a Dense softmax head, converted the way mpconvert converts it (the backbone's config gets the
policy, so every layer inside it computes in 16 bits, each MultiHeadAttention's Softmax included), and
the same model with those Softmax layers set to float32 on the live objects (which a saved .keras file
does not keep). Prints, per policy, the largest difference of the head's probabilities from float32, the
mean difference of the backbone's hidden states (over real tokens), and one batch of 256 rows timed in
tf.function (median of 20, the two variants alternating; float16 with TF_ENABLE_ONEDNN_OPTS=0, which a
conversion on an AMX CPU switches to). Each policy in its own process. Prints the CPU it ran on.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def measure(policy: str) -> None:
    import keras
    import keras_hub
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=64, intermediate_dim=128, max_sequence_length=32
    )
    inputs = {k: keras.Input((None,), dtype="int32", name=k) for k in ("token_ids", "segment_ids", "padding_mask")}
    model = keras.Model(
        inputs, keras.layers.Dense(3, activation="softmax", name="head")(backbone(inputs)["pooled_output"])
    )
    rng = np.random.default_rng(0)
    mask = (np.arange(32)[None, :] < rng.integers(4, 33, 256)[:, None]).astype("int32")
    x = {
        "token_ids": (rng.integers(1, 100, (256, 32)) * mask).astype("int32"),
        "segment_ids": 0 * mask,
        "padding_mask": mask,
    }

    def outputs(m):
        hidden = m.get_layer("bert_backbone")(x)["sequence_output"]
        return np.asarray(tf.cast(hidden, tf.float32))[mask.astype(bool)], np.asarray(m(x))

    reference = outputs(model)
    variants = {}
    for pinned in (False, True):
        config = model.get_config()
        for entry in config["layers"]:
            if entry["config"]["name"] == "bert_backbone":
                entry["config"]["dtype"] = policy
        converted = keras.Model.from_config(config)
        converted.set_weights(model.get_weights())
        softmax = [la for la in converted._flatten_layers() if type(la).__name__ == "Softmax"]
        for layer in softmax if pinned else ():
            layer.dtype_policy = "float32"
        hidden, probs = outputs(converted)
        serve = tf.function(lambda d, m=converted: m(d, training=False))
        feed = {k: tf.constant(v) for k, v in x.items()}
        serve(feed)
        variants[pinned] = (
            serve,
            feed,
            np.abs(probs - reference[1]).max(),
            np.abs(hidden - reference[0]).mean(),
            softmax[0].compute_dtype,
        )
    times = {False: [], True: []}
    for _ in range(20):
        for pinned, (serve, feed, *_) in variants.items():
            start = time.perf_counter()
            np.asarray(serve(feed))
            times[pinned].append(time.perf_counter() - start)
    for pinned, (_, _, head, hidden, dtype) in variants.items():
        ms = 1000 * float(np.median(times[pinned]))
        print(f"{policy:<16}{'Softmax ' + dtype:<18}{head:>16.6f}{hidden:>19.6f}{ms:>13.1f}")


def main() -> None:
    if len(sys.argv) > 1:
        measure(sys.argv[1])
        return
    from mpconvert.speed import read_cpu

    cpu, flags = read_cpu()
    print(f"Softmax inside attention, tiny BERT; CPU: {cpu} ({', '.join(flags) or 'no 16-bit flags'})")
    print(f"{'policy':<16}{'variant':<18}{'head max|diff|':>16}{'hidden mean|diff|':>19}{'ms/256 rows':>13}")
    for policy in ("mixed_float16", "mixed_bfloat16"):
        env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0" if policy == "mixed_float16" else "1")
        subprocess.run([sys.executable, __file__, policy], env=env, check=True)


if __name__ == "__main__":
    main()
