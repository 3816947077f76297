"""Per-layer dtype policy decisions, and the rebuilt mixed-precision model.

Setting the global policy and cloning does nothing to a loaded model: every
saved layer config carries its own `dtype`, so the clone is float32 again.
mpconvert therefore works on the model's config: it decides a policy for every
layer (`plan_conversion`, a pure function of the config), writes those
decisions into a copy of the config (`apply_plan`), rebuilds the model from it
and copies the float32 weights across exactly (`rewrite`).

Working on the config rather than on layer objects also covers graphs that
hold plain `keras.ops` operations (ConvNeXt): those have no dtype and are left
untouched, whereas rebuilding them with a new dtype fails.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from .errors import MpconvertError
from .frameworks import Framework
from .options import RewriteOptions

# Activations that turn logits into probabilities; their input must be
# float32 at the model's end or the loss sees a 16-bit tensor.
PROBABILITY_ACTIVATIONS = ("softmax", "log_softmax", "sigmoid")
SOFTMAX_ACTIVATIONS = ("softmax", "log_softmax")
SIXTEEN_BIT = ("float16", "bfloat16", "mixed_float16", "mixed_bfloat16")
MODEL_CLASSES = ("Functional", "Sequential", "Model")


@dataclass(frozen=True)
class LayerDecision:
    name: str  # path, "outer/inner/dense" for layers of nested models
    class_name: str
    policy: str | None  # None for plain operations, which have no policy
    pinned: str | None  # why the layer stays float32, None if converted

    def as_dict(self) -> dict:
        return {"name": self.name, "class_name": self.class_name, "policy": self.policy, "pinned": self.pinned}


@dataclass(frozen=True)
class Split:
    """A fused probability activation at a model output, moved into its own layer.

    The layer keeps its weights under `linear_name` and computes in 16 bits;
    a float32 `Activation` takes over the original name, so the model's
    output names do not change.
    """

    path: str
    activation: str
    linear_name: str


@dataclass(frozen=True)
class Plan:
    policy: str
    decisions: tuple[LayerDecision, ...]
    splits: tuple[Split, ...] = ()

    @property
    def mixed(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.decisions if d.policy == self.policy)

    def as_dicts(self) -> list[dict]:
        return [d.as_dict() for d in self.decisions]


@dataclass(frozen=True)
class Rewritten:
    model: Any
    plan: Plan
    framework: Framework
    stats: dict = field(default_factory=dict)


# --- reading configs -------------------------------------------------------


def _policy_name(dtype: Any) -> str | None:
    if dtype is None:
        return None
    if isinstance(dtype, str):
        return dtype
    if isinstance(dtype, dict):
        inner = dtype.get("config", {})
        if isinstance(inner, dict) and "name" in inner:
            return inner["name"]
    return str(dtype)


def _activation_name(activation: Any) -> str | None:
    if isinstance(activation, str):
        return activation
    if isinstance(activation, dict):  # serialized function
        config = activation.get("config")
        return config if isinstance(config, str) else activation.get("class_name")
    return None


def _is_container(entry: dict) -> bool:
    config = entry.get("config", {})
    return entry.get("class_name") in MODEL_CLASSES and isinstance(config.get("layers"), list)


def _is_sequential(container: dict, class_name: str) -> bool:
    return class_name == "Sequential" or "input_layers" not in container


def _output_names(container: dict, sequential: bool) -> set[str]:
    if sequential:
        layers = [e for e in container["layers"] if e.get("class_name") != "InputLayer"]
        return {layers[-1]["config"]["name"]} if layers else set()
    names: set[str] = set()

    def collect(ref: Any) -> None:
        # output_layers is [name, node, tensor], a list of those, or a dict of them
        if isinstance(ref, list) and len(ref) == 3 and isinstance(ref[0], str):
            names.add(ref[0])
        elif isinstance(ref, list):
            for item in ref:
                collect(item)
        elif isinstance(ref, dict):
            for item in ref.values():
                collect(item)

    collect(container.get("output_layers", []))
    return names


def _entry_name(entry: dict) -> str:
    return entry["config"]["name"]


# --- deciding --------------------------------------------------------------


class _Planner:
    def __init__(self, options: RewriteOptions):
        self.options = options
        self.patterns = [(p, re.compile(p)) for p in options.keep_float32]
        self.matched: set[str] = set()
        self.decisions: list[LayerDecision] = []
        self.splits: list[Split] = []
        self.taken_names: set[str] = set()

    def keep_reason(self, *candidates: str) -> str | None:
        for pattern, regex in self.patterns:
            if any(regex.fullmatch(c) for c in candidates):
                self.matched.add(pattern)
                return f"--keep-float32 {pattern!r}"
        return None

    def container(self, container: dict, class_name: str, prefix: str, at_output: bool, forced: str | None) -> None:
        sequential = _is_sequential(container, class_name)
        outputs = _output_names(container, sequential) if at_output else set()
        for entry in container["layers"]:
            self.taken_names.add(_entry_name(entry))
        for entry in container["layers"]:
            self.entry(entry, prefix, sequential, entry["config"]["name"] in outputs, forced)

    def entry(self, entry: dict, prefix: str, sequential: bool, is_output: bool, forced: str | None) -> None:
        name = _entry_name(entry)
        cls = entry["class_name"]
        config = entry["config"]
        path = prefix + name
        reason = forced or self.keep_reason(name, cls, path)
        if _is_container(entry):
            self.container(config, cls, path + "/", is_output, reason)
            return
        if cls == "InputLayer":
            return self.decide(path, cls, _policy_name(config.get("dtype")) or "float32", "input layer")
        if "dtype" not in config:
            # A plain operation (keras.ops / TF op) runs in its inputs' dtype,
            # so at a model output it needs a float32 cast after it.
            if is_output:
                self.decide(self.split(prefix, path, "linear", name + "_op"), cls, None, None)
                return self.decide(path, "Activation", "float32", "model output (float32 cast of an operation)")
            return self.decide(path, cls, None, None)
        current = _policy_name(config.get("dtype")) or "float32"
        if current in SIXTEEN_BIT:
            raise MpconvertError(
                f"layer {path!r} ({cls}) already has dtype policy {current!r}: this model "
                "is already mixed precision",
                hint="convert the float32 original instead; mpconvert does not convert twice",
            )
        if current != "float32":
            return self.decide(path, cls, current, f"dtype {current} is not float32; left unchanged")
        if reason:
            return self.decide(path, cls, "float32", reason)
        activation = _activation_name(config.get("activation"))
        if cls == "Softmax" or (cls == "Activation" and activation in SOFTMAX_ACTIVATIONS):
            return self.decide(path, cls, "float32", "softmax")
        if not is_output:
            return self.decide(path, cls, self.options.policy, None)
        single_call = sequential or len(entry.get("inbound_nodes", [])) == 1
        if cls != "Activation" and activation in PROBABILITY_ACTIVATIONS and single_call:
            # Report under the new names so the report matches the converted model.
            linear_path = self.split(prefix, path, activation, name + "_linear")
            self.decide(linear_path, cls, self.options.policy, None)
            return self.decide(path, "Activation", "float32", f"model output ({activation} split from {cls})")
        return self.decide(path, cls, "float32", "model output")

    def decide(self, path: str, cls: str, policy: str | None, pinned: str | None) -> None:
        self.decisions.append(LayerDecision(path, cls, policy, pinned))

    def split(self, prefix: str, path: str, activation: str, wanted: str) -> str:
        linear = self._fresh(wanted)
        self.splits.append(Split(path, activation, linear))
        return prefix + linear

    def _fresh(self, name: str) -> str:
        candidate, i = name, 1
        while candidate in self.taken_names:
            i += 1
            candidate = f"{name}_{i}"
        self.taken_names.add(candidate)
        return candidate


def plan_conversion(config: dict, model_class: str, options: RewriteOptions) -> Plan:
    """Decide every layer's policy from a model config (pure, no TensorFlow)."""
    planner = _Planner(options)
    planner.container(config, model_class, "", at_output=True, forced=None)
    unmatched = [p for p in options.keep_float32 if p not in planner.matched]
    if unmatched:
        raise MpconvertError(
            f"--keep-float32 {unmatched[0]!r} matches no layer name or class name",
            hint="patterns must match a whole name, e.g. 'conv2d_1', 'block1_.*' or "
            "'LayerNormalization'; run `mpconvert inspect MODEL` to list the layers",
        )
    return Plan(options.policy, tuple(planner.decisions), tuple(planner.splits))


# --- applying --------------------------------------------------------------


def _iter_containers(config: dict, class_name: str, prefix: str = "") -> Iterator[tuple[dict, bool, str]]:
    yield config, _is_sequential(config, class_name), prefix
    for entry in config["layers"]:
        if _is_container(entry):
            yield from _iter_containers(entry["config"], entry["class_name"], prefix + _entry_name(entry) + "/")


def apply_plan(config: dict, model_class: str, plan: Plan, mixed: set[str] | None = None) -> dict:
    """A copy of `config` with the plan's policies and splits written in.

    `mixed` restricts which layers get the 16-bit policy (the others stay
    float32); it is used to find the one layer that breaks a conversion.
    """
    mixed = set(plan.mixed) if mixed is None else mixed
    splits = {s.path: s for s in plan.splits}
    new = copy.deepcopy(config)
    for container, sequential, prefix in _iter_containers(new, model_class):
        entries = []
        for entry in container["layers"]:
            path = prefix + _entry_name(entry)
            split = splits.get(path)
            if split is not None:
                entries.extend(_split_entry(entry, split, sequential, mixed_here=prefix + split.linear_name in mixed, policy=plan.policy))
                continue
            if path in mixed:
                entry["config"]["dtype"] = plan.policy
            entries.append(entry)
        container["layers"] = entries
    return new


def _split_entry(entry: dict, split: Split, sequential: bool, mixed_here: bool, policy: str) -> list[dict]:
    original_name = _entry_name(entry)
    linear = copy.deepcopy(entry)
    linear["config"]["name"] = split.linear_name
    if "name" in linear:
        linear["name"] = split.linear_name
    if "activation" in linear["config"]:
        linear["config"]["activation"] = "linear"
    if mixed_here:
        linear["config"]["dtype"] = policy
    head = {
        "module": "keras.layers",
        "class_name": "Activation",
        "config": {"name": original_name, "trainable": True, "dtype": "float32", "activation": split.activation},
        "registered_name": None,
    }
    if not sequential:
        head["name"] = original_name
        # The legacy node format ([[name, node, tensor, kwargs]]) is read by
        # both Keras 3 and tf-keras, so one shape serves both frameworks.
        head["inbound_nodes"] = [[[split.linear_name, 0, 0, {}]]]
    return [linear, head]


# --- rebuilding -------------------------------------------------------------


def model_config(model: Any) -> dict:
    try:
        config = model.get_config()
    except NotImplementedError:
        config = None
    if not isinstance(config, dict) or not isinstance(config.get("layers"), list):
        raise MpconvertError(
            f"model {model.name!r} ({type(model).__name__}) is a subclassed model without a layer graph",
            hint="mpconvert converts Functional and Sequential models; rebuild it as one, "
            "or set the policy in its code with keras.mixed_precision.set_global_policy",
        )
    return config


def model_class(model: Any) -> str:
    return "Sequential" if type(model).__name__ == "Sequential" else "Functional"


def plan_for(model: Any, options: RewriteOptions) -> Plan:
    return plan_conversion(model_config(model), model_class(model), options)


def rewrite(model: Any, framework: Framework, options: RewriteOptions, smoke_inputs: list[np.ndarray]) -> Rewritten:
    """Rebuild `model` with the planned policies; the original is not touched."""
    config = model_config(model)
    cls = model_class(model)
    plan = plan_conversion(config, cls, options)
    with framework.preserved_global_policy():
        try:
            new = _build(framework, model, apply_plan(config, cls, plan), smoke_inputs)
        except Exception as exc:
            raise _locate_failure(framework, model, config, cls, plan, smoke_inputs, exc) from exc
        renames = {s.path: s.linear_name for s in plan.splits}
        copied = _copy_weights(model, new, renames)
    return Rewritten(new, plan, framework, {"weights_copied": copied})


def _build(framework: Framework, model: Any, config: dict, smoke_inputs: list[np.ndarray]) -> Any:
    new = framework.model_from_config(model, config)
    # A symbolic rebuild can succeed while the first real call fails (a
    # custom layer adding a float32 constant to a float16 tensor), so every
    # candidate model runs once before it is accepted.
    new(smoke_inputs if len(smoke_inputs) > 1 else smoke_inputs[0], training=False)
    return new


def _locate_failure(framework, model, config, cls, plan, smoke_inputs, error) -> MpconvertError:
    """Find the first layer whose 16-bit policy breaks the model, by bisection.

    Converting only the first k layers of `plan.mixed` fails for every k past
    the culprit, so a binary search needs about log2(n) rebuilds.
    """
    order = list(plan.mixed)

    def fails(k: int) -> bool:
        try:
            _build(framework, model, apply_plan(config, cls, plan, set(order[:k])), smoke_inputs)
            return False
        except Exception:
            return True

    if fails(0):
        return MpconvertError(
            f"model {model.name!r} cannot be rebuilt from its own config, even in float32: {_short(error)}",
            hint="check that the model's custom layers implement get_config() for all constructor arguments",
        )
    lo, hi = 0, len(order)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid
    culprit = order[hi - 1]
    class_name = next(d.class_name for d in plan.decisions if d.name == culprit)
    leaf = culprit.rsplit("/", 1)[-1]
    return MpconvertError(
        f"layer {culprit!r} ({class_name}) cannot run under {plan.policy}: {_short(error)}",
        hint=f"keep it in float32 with --keep-float32 {re.escape(leaf)!r}, or make the layer "
        "cast its own tensors with tf.cast(x, self.compute_dtype)",
    )


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return (text[:240] + "...") if len(text) > 240 else text or type(error).__name__


def _copy_weights(old: Any, new: Any, renames: dict[str, str]) -> int:
    """Copy every layer's float32 weights by name; returns the number of arrays."""
    copied = 0
    for layer in old.layers:
        weights = layer.get_weights()
        if not weights:
            continue
        target = new.get_layer(renames.get(layer.name, layer.name))
        target.set_weights(weights)
        for before, after in zip(weights, target.get_weights()):
            if before.shape != after.shape or not np.array_equal(before, after):
                raise AssertionError(f"weights of {layer.name!r} changed while copying")
        copied += len(weights)
    return copied


def output_activation(config: dict, class_name: str) -> str | None:
    """The activation that produces the model's first output, if any."""
    sequential = _is_sequential(config, class_name)
    if sequential:
        entry = [e for e in config["layers"] if e.get("class_name") != "InputLayer"][-1]
    else:
        first = _first_output_name(config.get("output_layers"))
        entry = next(e for e in config["layers"] if _entry_name(e) == first)
    if _is_container(entry):
        return output_activation(entry["config"], entry["class_name"])
    if entry["class_name"] == "Softmax":
        return "softmax"
    return _activation_name(entry["config"].get("activation"))


def _first_output_name(ref: Any) -> str:
    if isinstance(ref, list) and len(ref) == 3 and isinstance(ref[0], str):
        return ref[0]
    items = list(ref.values()) if isinstance(ref, dict) else list(ref)
    return _first_output_name(items[0])
