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
import dataclasses
import gc
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpconvert.data.formats import INPUT_LAYER
from mpconvert.data.signature import signature_of
from mpconvert.keras.configs import (
    PROBABILITY_ACTIVATIONS,
    SOFTMAX_ACTIVATIONS,
    activation_name,
    builtin_entry,
    entry_name,
    model_class,
    model_config,
    policy_name,
    rename_entry,
    tensor_refs,
)
from mpconvert.keras.fidelity import prove_faithful
from mpconvert.keras.frameworks import Framework
from mpconvert.keras.state import copy_model_state
from mpconvert.keras.trace import Sublayer, sublayers
from mpconvert.options.precision import SIXTEEN_BIT
from mpconvert.options.rewrite import RewriteOptions
from mpconvert.report.sections import Fidelity, Layer
from mpconvert.system.errors import MpconvertError

MODEL_CLASSES = ("Functional", "Sequential", "Model")
# Preprocessing layers that map values to ids, bins or counts: integer work
# with nothing to gain from 16 bits, and tf-keras's CategoryEncoding cannot
# run in them at all (tf.math.bincount has no float16/bfloat16 kernel).
INDEXING_LAYERS = (
    "IntegerLookup",
    "StringLookup",
    "Hashing",
    "HashedCrossing",
    "CategoryEncoding",
    "Discretization",
    "TextVectorization",
)


@dataclass(frozen=True)
class LayerDecision:
    name: str  # path, "outer/inner/dense" for layers of nested models
    class_name: str
    policy: str | None  # None for plain operations, which have no policy
    pinned: str | None  # why the layer stays float32, None if converted
    inside: str | None = None  # for a sublayer built by a layer's own code: that layer's path (not a decision)


@dataclass(frozen=True)
class ActivationSplit:
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
    splits: tuple[ActivationSplit, ...] = ()
    # The sublayers that layers build in their own code (`with_sublayers`): shown, not decided.
    inner: tuple[LayerDecision, ...] = ()

    @property
    def mixed(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.decisions if d.policy == self.policy)

    @property
    def rows(self) -> tuple[LayerDecision, ...]:
        """Every decision, each followed by the sublayers inside it."""
        by_outer: dict[str, list[LayerDecision]] = {}
        for d in self.inner:
            by_outer.setdefault(d.inside or "", []).append(d)
        return tuple(row for d in self.decisions for row in (d, *by_outer.get(d.name, ())))

    def as_layers(self) -> tuple[Layer, ...]:
        """As the report's `layers` lists them."""
        return tuple(Layer(d.name, d.class_name, d.policy, d.pinned, d.inside) for d in self.rows)


@dataclass(frozen=True)
class Rewritten:
    model: Any
    plan: Plan
    fidelity: Fidelity | None = None  # the float32 rebuild of the plan against the original


# --- reading configs -------------------------------------------------------


def _is_container(entry: dict) -> bool:
    config = entry.get("config", {})
    return entry.get("class_name") in MODEL_CLASSES and isinstance(config.get("layers"), list)


def _is_sequential(container: dict, class_name: str) -> bool:
    return class_name == "Sequential" or "input_layers" not in container


def _output_names(container: dict, sequential: bool) -> list[str]:
    """Names of the layers producing a container's outputs, in output order."""
    if sequential:
        layers = [e for e in container["layers"] if e.get("class_name") != "InputLayer"]
        return [entry_name(layers[-1])] if layers else []
    return [ref[0] for ref in tensor_refs(container.get("output_layers", []))]


# --- deciding --------------------------------------------------------------


class _Planner:
    def __init__(self, options: RewriteOptions):
        self.options = options
        self.patterns = [(p, re.compile(p)) for p in options.keep_float32]
        self.automatic = dict(options.auto_keep)
        self.matched: set[str] = set()
        self.decisions: list[LayerDecision] = []
        self.splits: list[ActivationSplit] = []
        self.taken_names: set[str] = set()

    def keep_reason(self, *candidates: str) -> str | None:
        for pattern, regex in self.patterns:
            if any(regex.fullmatch(c) for c in candidates):
                self.matched.add(pattern)
                return f"--keep-float32 {pattern!r}"
        return None

    def container(self, container: dict, class_name: str, prefix: str, at_output: bool, forced: str | None) -> None:
        sequential = _is_sequential(container, class_name)
        outputs = set(_output_names(container, sequential)) if at_output else set()
        for entry in container["layers"]:
            self.taken_names.add(entry_name(entry))
        for entry in container["layers"]:
            self.entry(entry, prefix, sequential, entry["config"]["name"] in outputs, forced)

    def entry(self, entry: dict, prefix: str, sequential: bool, is_output: bool, forced: str | None) -> None:
        name = entry_name(entry)
        cls = entry["class_name"]
        config = entry["config"]
        path = prefix + name
        reason = forced or self.keep_reason(name, cls, path) or self.automatic.get(path)
        if _is_container(entry):
            self.container(config, cls, path + "/", is_output, reason)
            return
        if cls == "InputLayer":
            return self.decide(path, cls, policy_name(config.get("dtype")) or "float32", INPUT_LAYER)
        if "dtype" not in config:
            # A plain operation (keras.ops / TF op) runs in its inputs' dtype,
            # so at a model output it needs a float32 cast after it.
            if is_output:
                self.decide(self.split(prefix, path, "linear", name + "_op"), cls, None, None)
                return self.decide(path, "Activation", "float32", "model output (float32 cast of an operation)")
            return self.decide(path, cls, None, None)
        current = policy_name(config.get("dtype")) or "float32"
        if current in SIXTEEN_BIT:
            raise MpconvertError(
                f"layer {path!r} ({cls}) already has dtype policy {current!r}: this model is already mixed precision",
                hint="convert the float32 original instead; mpconvert does not convert twice",
            )
        if current != "float32":
            return self.decide(path, cls, current, f"dtype {current} is not float32; left unchanged")
        if reason:
            return self.decide(path, cls, "float32", reason)
        if cls in INDEXING_LAYERS:
            return self.decide(
                path, cls, "float32", "preprocessing layer: ids, bins or counts, nothing to compute in 16 bits"
            )
        activation = activation_name(config.get("activation"))
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
        self.splits.append(ActivationSplit(path, activation, linear))
        return prefix + linear

    def _fresh(self, name: str) -> str:
        candidate, i = name, 1
        while candidate in self.taken_names:
            i += 1
            candidate = f"{name}_{i}"
        self.taken_names.add(candidate)
        return candidate


def with_sublayers(plan: Plan, found: dict[str, tuple[Sublayer, ...]]) -> Plan:
    """`plan` with the sublayers of its layers (trace.sublayers of the model it plans, or was built from).

    Keras gives a sublayer the policy of the layer that builds it (keras-hub
    passes its `dtype` down; MultiHeadAttention builds its Softmax with its
    own policy), and neither config lists them, so they compute under what
    the plan gives that layer. Keras builds that Softmax at construction,
    without a path, so no DTypePolicyMap entry in the layer's config can pin
    it float32 where a saved .keras file keeps it (docs/conversion.md). A
    sublayer whose code set another policy keeps it.
    """
    by_name = {d.name: d for d in plan.decisions}
    inner = []
    for outer, rows in found.items():
        decided = by_name.get(outer)
        if decided is None:
            continue
        for sub in rows:
            follows = sub.policy == sub.outer_policy
            policy = decided.policy if follows else sub.policy
            pinned = None
            if policy == "float32" and policy != plan.policy:
                pinned = f"inside '{outer}': {decided.pinned}" if follows else f"set float32 by '{outer}''s own code"
            inner.append(LayerDecision(sub.path, sub.class_name, policy, pinned, outer))
    return dataclasses.replace(plan, inner=tuple(inner))


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
            yield from _iter_containers(entry["config"], entry["class_name"], prefix + entry_name(entry) + "/")


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
            path = prefix + entry_name(entry)
            split = splits.get(path)
            if split is not None:
                entries.extend(
                    _split_entry(
                        entry, split, sequential, mixed_here=prefix + split.linear_name in mixed, policy=plan.policy
                    )
                )
                continue
            if path in mixed:
                entry["config"]["dtype"] = plan.policy
            entries.append(entry)
        container["layers"] = entries
    return new


def _split_entry(entry: dict, split: ActivationSplit, sequential: bool, mixed_here: bool, policy: str) -> list[dict]:
    original_name = entry_name(entry)
    linear = copy.deepcopy(entry)
    rename_entry(linear, split.linear_name)
    if "activation" in linear["config"]:
        linear["config"]["activation"] = "linear"
    if mixed_here:
        linear["config"]["dtype"] = policy
    head = builtin_entry(
        "Activation", original_name, {"activation": split.activation}, None if sequential else split.linear_name
    )
    return [linear, head]


# --- rebuilding -------------------------------------------------------------


def rewrite(model: Any, framework: Framework, options: RewriteOptions, rows: list[np.ndarray]) -> Rewritten:
    """Rebuild `model` with the planned policies; the original is not touched.

    `rows` are validation inputs. First the plan is rebuilt with every layer
    in float32 and must reproduce the original on them (`prove_faithful`):
    a rebuild that loses state is refused before any policy could hide it.
    Then the 16-bit rebuild, whose first call (on two rows) must run. A
    layer that cannot hold its float32 weights under the policy (it stores
    them in the compute dtype) is kept float32 and the rebuild repeated.
    """
    config = model_config(model)
    cls = model_class(model)
    smoke = [x[:2] for x in rows]
    with framework.preserved_global_policy():
        plan = plan_conversion(config, cls, options)
        try:
            float32, _ = _build(framework, model, apply_plan(config, cls, plan, set()), plan, smoke)
        except Exception as exc:
            raise _unbuildable(model, exc) from exc
        fidelity = prove_faithful(model, float32, rows)
        # The proof's model is a whole copy of the weights: gone before the 16-bit one is built, so that a
        # rewrite holds two models at once, not three (Keras models are reference cycles: collected here).
        del float32
        gc.collect()
        while True:
            try:
                new, rounded = _build(framework, model, apply_plan(config, cls, plan), plan, smoke)
            except Exception as exc:
                raise _locate_failure(framework, model, config, cls, plan, smoke, exc) from exc
            if not rounded:
                # What the converted model's sublayers compute under, read from it.
                return Rewritten(new, with_sublayers(plan, sublayers(new)), fidelity)
            if any(path in dict(options.auto_keep) for path in rounded):
                raise AssertionError(f"layers kept float32 still round their weights: {sorted(rounded)}")
            compute = plan.policy.removeprefix("mixed_")
            kept = tuple(
                (
                    path,
                    f"stores its weights in {compute} under {plan.policy}, which rounds them (by up to {change:.3g})",
                )
                for path, change in rounded.items()
            )
            options = dataclasses.replace(options, auto_keep=options.auto_keep + kept)
            plan = plan_conversion(config, cls, options)


def rebuild_with(
    model: Any,
    framework: Framework,
    config: dict,
    model_class: str,
    plan: Plan,
    mixed: set[str],
    smoke_inputs: list[np.ndarray],
) -> Any:
    """`model` rebuilt with only the `mixed` layers of `plan` in 16 bits (the search's trials).

    Built exactly as `rewrite` builds, from the same plan, whose float32
    rebuild `rewrite` proved faithful.
    """
    with framework.preserved_global_policy():
        return _build(framework, model, apply_plan(config, model_class, plan, mixed), plan, smoke_inputs)[0]


# Recurrent layers that take `unroll`: the same cell, applied step by step without a while loop.
RECURRENT = ("LSTM", "GRU", "SimpleRNN")


def float32_copy(model: Any, framework: Framework, smoke_inputs: list[np.ndarray], unroll: bool = False) -> Any:
    """A converted `model` rebuilt with every layer in float32 and all its state: its weights, computed in float32.

    What a runtime that stores 16-bit weights but chooses its own compute
    precision (LiteRT) is converted from. Built from the converted model's
    own config, as `rewrite` builds its float32 proof. `unroll` unrolls the
    recurrent layers (the same cell and weights, as many steps as the
    sequence has; it needs a fixed length): LiteRT has no builtin for the
    while loop's TensorList ops at a variable batch.
    """
    config = copy.deepcopy(model_config(model))
    for container, _, _ in _iter_containers(config, model_class(model)):
        for entry in container["layers"]:
            # Only float policies: a string Input or StringLookup keeps "string", an integer one its int64.
            if (policy_name(entry.get("config", {}).get("dtype")) or "").startswith(("float", "bfloat", "mixed_")):
                entry["config"]["dtype"] = "float32"
            if unroll and entry.get("class_name") in RECURRENT and "unroll" in entry.get("config", {}):
                entry["config"]["unroll"] = True
    with framework.preserved_global_policy():
        new = unfilled_from_config(framework, model, config)
        copy_model_state(framework, model, new, {})
        new(signature_of(new).feed(smoke_inputs), training=False)
        return new


# Keras 3 layers whose config's `*_initializer` entries are the attributes their get_config writes back.
UNFILLED_LAYERS = frozenset({"Dense", "EinsumDense", "Conv1D", "Conv2D", "Conv3D", "Embedding", "LayerNormalization"})
_ZEROS: dict[str, Any] = {"module": "keras.initializers", "class_name": "Zeros", "config": {}, "registered_name": None}


def unfilled_from_config(framework: Framework, model: Any, config: dict) -> Any:
    """`model`'s class built from `config` without drawing initial weights, for a caller that copies all of them.

    Drawing them costs TensorFlow's allocator several of the largest weight's temporaries beside the model
    (a random draw, its scaling, the variable's copy), and its oneDNN CPU allocator keeps what it freed for
    its own next tensors: a rebuild of a 1.07 GB Dense stack grew the process by 0.8 GiB more than its
    weights. So the initializers of the layers that keep them under their config's names (UNFILLED_LAYERS)
    are zeros while building and theirs again after; where the config it then gives differs from `config`
    in any of them, the model is built again as `config` says.
    """
    if not framework.is_keras3:
        return framework.model_from_config(model, config)
    blank = copy.deepcopy(config)
    swapped: list[tuple[str, str, Any]] = []
    for container, _, prefix in _iter_containers(blank, model_class(model)):
        for entry in container["layers"]:
            if entry.get("class_name") not in UNFILLED_LAYERS or not str(entry.get("module", "")).startswith("keras"):
                continue
            for key, value in entry["config"].items():
                if key.endswith("_initializer") and isinstance(value, dict):
                    swapped.append((prefix + entry_name(entry), key, value))
                    entry["config"][key] = dict(_ZEROS)
    new = framework.model_from_config(model, blank)
    for path, key, value in swapped:
        layer = new
        for name in path.split("/"):
            layer = layer.get_layer(name)
        setattr(layer, key, framework.module.initializers.get(copy.deepcopy(value)))
    if _same_initializers(model_config(new), config, model_class(model)):
        return new
    return framework.model_from_config(model, config)


def _same_initializers(built: dict, wanted: dict, class_name: str) -> bool:
    def found(config: dict) -> list[Any]:
        return [
            (prefix + entry_name(e), k, v)
            for container, _, prefix in _iter_containers(config, class_name)
            for e in container["layers"]
            for k, v in e.get("config", {}).items()
            if k.endswith("_initializer")
        ]

    return found(built) == found(wanted)


def _build(
    framework: Framework, model: Any, config: dict, plan: Plan, smoke_inputs: list[np.ndarray]
) -> tuple[Any, dict[str, float]]:
    """The model from `config` with all of `model`'s state; and the layers whose weights it rounded."""
    new = unfilled_from_config(framework, model, config)
    # The state goes in before the first call: a lookup layer called before
    # its vocabulary arrives fails ("Table not initialized").
    rounded = copy_model_state(framework, model, new, {s.path: s.linear_name for s in plan.splits})
    # A symbolic rebuild can succeed while the first real call fails (a
    # custom layer adding a float32 constant to a float16 tensor), so every
    # candidate model runs once before it is accepted.
    new(signature_of(new).feed(smoke_inputs), training=False)
    return new, rounded


def _unbuildable(model: Any, error: BaseException) -> MpconvertError:
    return MpconvertError(
        f"model {model.name!r} cannot be rebuilt from its own config, even in float32: {_short(error)}",
        hint="check that the model's custom layers implement get_config() for all constructor arguments",
    )


def _locate_failure(framework, model, config, cls, plan, smoke_inputs, error) -> MpconvertError:
    """Find the first layer whose 16-bit policy breaks the model, by bisection.

    Converting only the first k layers of `plan.mixed` fails for every k past
    the culprit, so a binary search needs about log2(n) rebuilds.
    """
    order = list(plan.mixed)
    if not order:  # nothing in 16 bits: the float32 rebuild itself failed
        return _unbuildable(model, error)

    def fails(k: int) -> bool:
        try:
            _build(framework, model, apply_plan(config, cls, plan, set(order[:k])), plan, smoke_inputs)
            return False
        except Exception:
            return True

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


def output_activation(config: dict, class_name: str) -> str | None:
    """The activation that produces the model's first output, if any."""
    first = _output_names(config, _is_sequential(config, class_name))[0]
    entry = next(e for e in config["layers"] if entry_name(e) == first)
    if _is_container(entry):
        return output_activation(entry["config"], entry["class_name"])
    if entry["class_name"] == "Softmax":
        return "softmax"
    return activation_name(entry["config"].get("activation"))
