"""Reading and editing Keras model configs, in both frameworks' formats.

The rewrite and padding stages both work on a model's config rather than on
its layer objects. Keras 3 and tf-keras write that config differently
(tensor references as `__keras_tensor__` dicts or as legacy
`[name, node, tensor, kwargs]` lists; policies as dicts or strings), and
Keras 3's live `get_config()` mixes tuples into it; this module is the one
place that knows those shapes.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from mpconvert.system.errors import MpconvertError

# Why an input layer "stays float32" in a plan: it computes nothing, so counts of kept layers leave it out.

Ref = tuple[str, int, int]  # (layer name, node index, tensor index)

# Activations that turn logits into probabilities; their input must be
# float32 at the model's end or the loss sees a 16-bit tensor.
PROBABILITY_ACTIVATIONS = ("softmax", "log_softmax", "sigmoid")
SOFTMAX_ACTIVATIONS = ("softmax", "log_softmax")
# Layers that compute statistics of their input (squares, means).
NORMALIZATION_LAYERS = (
    "BatchNormalization",
    "LayerNormalization",
    "GroupNormalization",
    "RMSNormalization",
    "UnitNormalization",
)
# ... of which these normalize across the channels (the last axis), so a padded channel would change them.
CHANNEL_NORMALIZATION_LAYERS = frozenset(NORMALIZATION_LAYERS) - {"BatchNormalization"}


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


def lists_layers(layer: Any) -> bool:
    """Whether a layer's config lists its layers (a Functional or Sequential model): the rewrite sets their
    policies one by one. A keras-hub backbone is a Functional model whose config holds only its constructor's
    arguments, so its layers are built by its own code and follow its policy."""
    try:
        config = layer.get_config()
    except Exception:  # NotImplementedError, or a custom layer whose get_config fails: no list either way
        return False
    return isinstance(config, dict) and isinstance(config.get("layers"), list)


def policy_of(layer: Any) -> str | None:
    """The name of the policy a live layer computes under (a DTypePolicyMap's entry for the layer's path)."""
    policy = getattr(layer, "dtype_policy", None)
    if policy is None:
        return None
    if hasattr(policy, "default_policy"):  # Keras 3's DTypePolicyMap
        path = getattr(layer, "path", None)
        policy = policy[path] if path else policy.default_policy
    return getattr(policy, "name", None)


def model_class(model: Any) -> str:
    return "Sequential" if type(model).__name__ == "Sequential" else "Functional"


def entry_name(entry: dict) -> str:
    return entry["config"]["name"]


def rename_entry(entry: dict, name: str) -> None:
    """Rename a layer entry; functional entries repeat the name at the top."""
    entry["config"]["name"] = name
    if "name" in entry:
        entry["name"] = name


def builtin_entry(class_name: str, name: str, config: dict, source: str | None) -> dict:
    """A config entry for a weightless built-in layer pinned to float32.

    `source` is the layer it is called on (None inside a Sequential). The
    legacy node format is read by both Keras 3 and tf-keras, so one shape
    serves both frameworks.
    """
    entry: dict[str, Any] = {
        "module": "keras.layers",
        "class_name": class_name,
        "config": {"name": name, "trainable": True, "dtype": "float32", **config},
        "registered_name": None,
    }
    if source is not None:
        entry["name"] = name
        entry["inbound_nodes"] = [[[source, 0, 0, {}]]]
    return entry


def policy_name(dtype: Any) -> str | None:
    if dtype is None:
        return None
    if isinstance(dtype, str):
        return dtype
    if isinstance(dtype, dict):
        inner = dtype.get("config", {})
        if isinstance(inner, dict) and "name" in inner:
            return inner["name"]
    return str(dtype)


def activation_name(activation: Any) -> str | None:
    if isinstance(activation, str):
        return activation
    if isinstance(activation, dict):  # serialized function
        config = activation.get("config")
        return config if isinstance(config, str) else activation.get("class_name")
    return None


def _ref_holders(value: Any) -> Iterator[Any]:
    """Every [name, node, tensor] sequence inside inbound nodes or output_layers."""
    if isinstance(value, dict):
        if value.get("class_name") == "__keras_tensor__":
            yield value["config"]["keras_history"]
            return
        for item in value.values():
            yield from _ref_holders(item)
    elif isinstance(value, (list, tuple)):
        if len(value) in (3, 4) and isinstance(value[0], str) and isinstance(value[1], int):
            yield value
            return
        for item in value:
            yield from _ref_holders(item)


def tensor_refs(value: Any) -> Iterator[Ref]:
    for holder in _ref_holders(value):
        yield holder[0], holder[1], holder[2]


def rename_refs(value: Any, old: str, new: str) -> None:
    """Point references to layer `old` at layer `new`, in place (needs `listify`d configs)."""
    for holder in _ref_holders(value):
        if holder[0] == old:
            holder[0] = new


def listify(value: Any) -> Any:
    """A copy with tuples turned into lists, so references can be edited in place."""
    if isinstance(value, dict):
        return {k: listify(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [listify(v) for v in value]
    return copy.deepcopy(value)
