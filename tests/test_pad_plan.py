"""The padding planner on hand-written configs and shapes: no TensorFlow, numbers by hand."""

import subprocess
import sys

import pytest
from pad_nets import Net

from mpconvert.keras.pad import LayerGraph, plan_padding
from mpconvert.options.pad import PadOptions
from mpconvert.report.sections.stages import PaddedDim, SkippedDim

FORMATS = ["keras3", "tf_keras"]


def classifier(fmt: str) -> LayerGraph:
    """features(30) -> Dense(100, relu) -> Dense(10) -> softmax at the output, as rewrite leaves it."""
    net = Net(fmt)
    x = net.input("features", (30,))
    h = net("Dense", "hidden", x, shape=(100,), units=100, activation="relu")
    logits = net("Dense", "predictions_linear", h, shape=(10,), units=10, activation="linear")
    return net.graph(net("Activation", "predictions", logits, shape=(10,), activation="softmax"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_classifier_is_padded_with_flops_and_slice_by_hand(fmt):
    plan = plan_padding(classifier(fmt), PadOptions())
    assert plan.padded == (
        PaddedDim("features", "features", 30, 32),
        PaddedDim("hidden", "units", 100, 104),
        PaddedDim("predictions_linear", "units", 10, 16),
    )
    assert plan.skipped == ()
    assert plan.sizes == {"hidden": 104, "predictions_linear": 16}
    assert plan.input_pads == {"features": 32}
    # the 16 logits are cut back to 10 right before the float32 softmax
    assert plan.slices == (("predictions_linear", "predictions"),)
    assert plan.flatten_maps == {}
    # multiply-adds per sample: 30*100 + 100*10; padded 32*104 + 104*16
    assert (plan.flops, plan.padded_flops) == (4000, 4992)
    assert plan.flops_overhead == pytest.approx(0.248)
    assert not plan.empty


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_small_budget_takes_the_cheapest_spaces_and_names_the_flops_of_the_rest(fmt):
    # Each space alone: hidden +160 (30*104 + 104*10 = 4160), features +200,
    # predictions_linear +600. hidden and features together: 32*104 + 104*10
    # = 4368 (+9.2%); all three reach 4992 (+24.8%), over 10%.
    plan = plan_padding(classifier(fmt), PadOptions(max_overhead=0.1))
    assert [(d.layer, d.to) for d in plan.padded] == [("features", 32), ("hidden", 104)]
    assert plan.skipped == (
        SkippedDim(
            "predictions_linear", "units", 10, "would raise the model's FLOPs to +24.8% (over --max-pad-overhead 0.1)"
        ),
    )
    assert plan.slices == () and plan.padded_flops == 4368


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_add_of_different_widths_skips_both_branches(fmt):
    net = Net(fmt)
    x = net.input("features", (16,))
    gate = net("Dense", "gate", x, shape=(1,), units=1)
    wide = net("Dense", "wide", x, shape=(30,), units=30)
    total = net("Add", "sum", [gate, wide], shape=(30,))  # the 1 broadcasts
    plan = plan_padding(net.graph(net("Dense", "value", total, shape=(8,), units=8)), PadOptions())
    reason = "joined channels have different widths [1, 30]"
    assert plan.skipped == (
        SkippedDim("gate", "units", 1, reason),
        SkippedDim("wide", "units", 30, reason),
    )
    assert plan.padded == () and plan.empty


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_layernorm_after_a_dense_skips_it_with_its_reason(fmt):
    net = Net(fmt)
    x = net.input("features", (32,))
    h = net("Dense", "dense100", x, shape=(100,), units=100)
    h = net("LayerNormalization", "ln", h, shape=(100,), axis=-1)
    plan = plan_padding(net.graph(net("Dense", "predictions", h, shape=(4,), units=4)), PadOptions())
    assert plan.skipped == (
        SkippedDim("dense100", "units", 100, "feeds LayerNormalization 'ln', which normalizes across this axis"),
        SkippedDim("predictions", "units", 4, "narrower than the multiple (4 < 8); padding would not pay"),
    )
    assert plan.padded == ()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_layer_with_two_inbound_nodes_is_called_more_than_once(fmt):
    net = Net(fmt)
    left, right = net.input("left", (30,)), net.input("right", (30,))
    net("Dense", "shared", left, right, shape=(100,), units=100)  # one layer, two calls
    diff = net("Subtract", "diff", [("shared", 0), ("shared", 1)], shape=(100,))
    graph = net.graph(net("Dense", "score", diff, shape=(1,), units=1))
    assert graph.layers["shared"].calls == 2
    plan = plan_padding(graph, PadOptions())
    # shared keeps its width without a skip entry: a layer called twice is not a producer
    assert {s.layer: s.reason for s in plan.skipped} == {
        "left": "feeds Dense 'shared', which is called more than once",
        "right": "feeds Dense 'shared', which is called more than once",
        "score": "narrower than the multiple (1 < 8); padding would not pay",
    }
    # a layer called twice has no single cost: only score's 100*1 is counted
    assert plan.flops == 100 and plan.padded == ()


@pytest.mark.parametrize("fmt", FORMATS)
def test_conv_flops_come_from_kernel_size_and_depth_multiplier(fmt):
    net = Net(fmt)
    x = net.input("image", (8, 8, 3))
    c = net("Conv2D", "conv30", x, shape=(8, 8, 30), filters=30, kernel_size=[3, 3], padding="same")
    s = net(
        "SeparableConv2D",
        "sep20",
        c,
        shape=(8, 8, 20),
        filters=20,
        kernel_size=[3, 3],
        depth_multiplier=2,
        padding="same",
    )
    g = net("GlobalAveragePooling2D", "gap", s, shape=(20,))
    plan = plan_padding(net.graph(net("Dense", "value", g, shape=(1,), units=1)), PadOptions())
    # conv30 3*3*3*30 * 64 positions, sep20 (3*3*30*2 + 30*2*20) * 64, value 20*1
    assert plan.flops == 51840 + 111360 + 20
    # padded: 3*3*3*32 * 64, (3*3*32*2 + 32*2*24) * 64, 24*1
    assert plan.padded_flops == 55296 + 135168 + 24
    assert [(d.layer, d.to) for d in plan.padded] == [("conv30", 32), ("sep20", 24)]
    assert {s.layer: s.reason for s in plan.skipped} == {
        "image": "narrower than the multiple (3 < 8); padding would not pay",
        "value": "narrower than the multiple (1 < 8); padding would not pay",
    }


def test_planning_imports_no_tensorflow():
    code = "import sys, mpconvert.keras.pad; sys.exit(sorted({'tensorflow', 'keras', 'tf_keras'} & set(sys.modules)) or None)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
