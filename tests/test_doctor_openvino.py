"""`doctor MODEL`'s advice across runtimes, on hand-written figures: the fastest way to serve names both the
policy and the runtime, with its ratio (the real run is in test_speed.py's doctor MODEL test)."""

from mpconvert.commands.doctor_model import advise
from mpconvert.report.doctor import OpenVinoTiming, PolicyTiming, WithFix

DEVICE = "CPU: Xeon"


def policies(fp16=None, bf16=None, fp16_fixed=None):
    def timing(speedup, fixed=None):
        if speedup is None:
            with_fix = None if fixed is None else WithFix("TF_ENABLE_ONEDNN_OPTS=0", 10.0 / fixed, 10.0, fixed)
            return PolicyTiming(None, None, "cut short: a broken kernel", True, with_fix)
        return PolicyTiming(10.0 / speedup, speedup, None, False)

    return {
        "float32": PolicyTiming(10.0, 1.0, None, False),
        "mixed_float16": timing(fp16, fp16_fixed),
        "mixed_bfloat16": timing(bf16),
    }


def ir(speedup, precision="bf16"):
    return OpenVinoTiming(10.0 / speedup, speedup, 10.0, precision)


def test_openvino_is_named_where_tensorflow_serves_the_policy_slower():
    # MobileNetV2 on the AMX Xeon: TensorFlow mixed_bfloat16 0.58x float32, its OpenVINO IR 1.54x
    best, setting, runtime, said = advise(policies(fp16=0.02, bf16=0.58), {"mixed_bfloat16": ir(1.54)}, DEVICE)
    assert (best, setting, runtime) == ("mixed_bfloat16", None, "openvino")
    assert said.startswith("mixed_bfloat16 served by OpenVINO: convert with --policy mixed_bfloat16 --export openvino")
    assert "1.54x TensorFlow float32's speed here (CPU: Xeon, bf16)" in said
    assert "on TensorFlow mixed_bfloat16 serves it 0.58x (slower than float32)" in said


def test_tensorflow_is_named_where_it_is_faster_and_openvino_follows_with_its_figure():
    best, setting, runtime, said = advise(policies(bf16=1.87), {"mixed_bfloat16": ir(1.5)}, DEVICE)
    assert (best, setting, runtime) == ("mixed_bfloat16", None, "tensorflow")
    assert said.startswith("mixed_bfloat16 on TensorFlow: this model serves 1.87x as fast as float32")
    assert said.endswith("mixed_bfloat16 its OpenVINO IR 1.50x")


def test_a_broken_kernels_policy_can_still_be_served_by_openvino():
    found = advise(policies(fp16=None, bf16=0.9, fp16_fixed=1.2), {"mixed_float16": ir(2.65, "f16")}, DEVICE)
    best, setting, runtime, said = found
    assert (best, setting, runtime) == ("mixed_float16", None, "openvino")
    assert "on TensorFlow mixed_float16 was not timed (cut short: a broken kernel)" in said
    # without the IR, the fix is what serves it
    assert advise(policies(bf16=0.9, fp16_fixed=1.2), {}, DEVICE)[:3] == (
        "mixed_float16",
        "TF_ENABLE_ONEDNN_OPTS=0",
        "tensorflow",
    )


def test_float32_is_kept_when_no_runtime_pays_and_every_figure_is_listed():
    best, setting, runtime, said = advise(policies(fp16=0.5, bf16=1.05), {"mixed_bfloat16": ir(1.08)}, DEVICE)
    assert (best, setting, runtime) == (None, None, None)
    assert said.startswith("keep float32 here: no policy serves this model at least 1.1x as fast as float32")
    assert "mixed_bfloat16 its OpenVINO IR 1.08x" in said and "mixed_float16 on TensorFlow 0.50x" in said
