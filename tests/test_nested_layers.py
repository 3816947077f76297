"""Layers inside layers: each one a row of report.json's `layers`, with its path.

A Sequential inside a Functional model is planned layer by layer ("block/d1"). Layers that a layer builds
in its own code (MultiHeadAttention's projections and Softmax, a keras-hub backbone's blocks) are listed
under it (`inside`), with the policy they compute under: the one the conversion gives that layer, their
Softmax included (Keras builds it without a path, so no saved config can pin it float32; docs/conversion.md).
"""

import json

import keras
import nested_models as nm
from conftest import invoke

from mpconvert.keras.configs import model_class, model_config
from mpconvert.keras.rewrite import plan_conversion, with_sublayers
from mpconvert.keras.trace import sublayers
from mpconvert.options.rewrite import RewriteOptions
from mpconvert.report.gate import layer_counts
from mpconvert.report.sections import Layer


def _plan(model, policy="mixed_float16"):
    planned = plan_conversion(model_config(model), model_class(model), RewriteOptions(policy=policy))
    return with_sublayers(planned, sublayers(model))


def test_a_sequential_inside_a_functional_model_is_a_row_per_layer_with_its_path():
    rows = {layer.name: layer for layer in _plan(nm.sequential_inside()).as_layers()}
    assert rows["block/d1"] == Layer("block/d1", "Dense", "mixed_float16", None)
    assert rows["block/d2"] == Layer("block/d2", "Dense", "mixed_float16", None)
    assert rows["head"].policy == "float32" and rows["head_linear"].policy == "mixed_float16"
    assert all(layer.inside is None for layer in rows.values())  # a config that lists its layers: decisions


def test_layers_a_layer_builds_are_listed_under_it_and_not_counted_as_decisions():
    x = keras.Input((4, 8), name="x")
    attended = keras.layers.MultiHeadAttention(2, 4, dropout=0.1, name="mha")(x, x)
    model = keras.Model(x, keras.layers.Dense(2, name="out")(keras.layers.Flatten(name="flat")(attended)))
    plan = _plan(model)
    layers = plan.as_layers()
    names = [layer.name for layer in layers]
    inner = [layer for layer in layers if layer.inside == "mha"]
    assert {layer.class_name for layer in inner} == {"EinsumDense", "Softmax", "Dropout"}
    assert names.index("mha") < names.index(inner[0].name) < names.index("flat")  # right under their layer
    assert "mha/query" in names and "mha/attention_output" in names
    softmax = next(layer for layer in inner if layer.class_name == "Softmax")
    assert softmax.name.startswith("mha/softmax") and softmax.policy == "mixed_float16" and softmax.pinned is None
    # Counted as before: mha, flat converted (out is the output); its sublayers are not decisions.
    counts = layer_counts("mixed_float16", layers)
    assert counts.converted == 2 and [layer.name for layer in counts.kept] == ["out"]
    # Kept float32, the layer takes its sublayers with it.
    kept = with_sublayers(
        plan_conversion(
            model_config(model), model_class(model), RewriteOptions("mixed_float16", keep_float32=("mha",))
        ),
        sublayers(model),
    )
    assert {d.policy for d in kept.inner} == {"float32"}
    assert all(d.pinned == "inside 'mha': --keep-float32 'mha'" for d in kept.inner)


def test_a_row_without_inside_reads_back_from_an_older_report():
    old = {"name": "dense", "class_name": "Dense", "policy": "mixed_float16", "pinned": None}
    assert Layer.from_json(old).inside is None
    row = Layer("bert/block/softmax", "Softmax", "mixed_float16", None, "bert")
    assert Layer.from_json(json.loads(json.dumps(row.to_json()))) == row


def test_a_keras_hub_backbone_shows_its_inner_layers_and_its_softmax_as_it_computes(tmp_path):
    import keras_hub  # noqa: F401  (the backbone's classes, for loading model.keras back)

    policy, compute = "mixed_float16", "float16"

    model = nm.tiny_bert(tmp_path / "bert.keras")
    out = tmp_path / "out"
    args = ["--import", "keras_hub", "--data", nm.bert_npz(tmp_path / "bert.npz"), "--out", out]
    result = invoke(model, "--policy", policy, *args, "--finetune-steps", "0", "--no-speed", "--export", "savedmodel")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    rows = {row["name"]: row for row in report["layers"]}
    assert rows["bert_backbone"]["policy"] == policy and rows["bert_backbone"].get("inside") is None
    inner = [row for row in report["layers"] if row.get("inside") == "bert_backbone"]
    assert "bert_backbone/transformer_layer_0/self_attention_layer/query" in rows
    assert rows["bert_backbone/transformer_layer_1/feedforward_output_dense"]["policy"] == policy
    softmax = sorted(row["name"] for row in inner if row["class_name"] == "Softmax")
    assert [name.rsplit("/", 1)[0] for name in softmax] == [
        f"bert_backbone/transformer_layer_{i}/self_attention_layer" for i in (0, 1)
    ]
    # What the docs say: the Softmax inside attention takes the backbone's policy.
    assert {rows[name]["policy"] for name in softmax} == {policy}
    assert f"bert_backbone: {len(inner)} layers inside it ({len(inner)} {policy}), its 2 Softmax in {policy}" in (
        result.output
    )
    # The gate counts decisions: bert_backbone and head_linear converted, the head kept.
    assert report["gate"]["checks"][0]["values"]["converted"] == 2
    # The file training resumes from computes the same: its Softmax layers, loaded back, in 16 bits.
    reloaded = keras.models.load_model(out / "model.keras", compile=False)
    loaded = [layer for layer in reloaded._flatten_layers() if type(layer).__name__ == "Softmax"]
    assert len(loaded) == 2 and {layer.compute_dtype for layer in loaded} == {compute}
    assert 'class="layer inner"' in (out / "report.html").read_text()
