"""The accuracy-driven search over Keras layers: each layer ranked alone, then the kind-free engine
(numerics/search.py) grows and prunes the set kept float32.

Ranking (one pass, no conversion): every convertible layer alone in 16 bits, fed the float32 model's own
inputs for it, against its float32 output. Trials rebuild the model from its config with a set of layers
in 16 bits and predict the validation rows in memory: no disk, no fine-tune.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mpconvert.data.context import Context
from mpconvert.keras.configs import model_class, model_config
from mpconvert.keras.frameworks import Framework
from mpconvert.keras.load import Loaded
from mpconvert.keras.rewrite import Plan, rebuild_with
from mpconvert.keras.trace import Call, layer_at, trace
from mpconvert.numerics.search import Goal, Search, search_ranked, sensitivity
from mpconvert.runners.keras import predict


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _float32_twin(layer: Any) -> Any:
    return type(layer).from_config({**layer.get_config(), "dtype": "float32"})


def rank(
    original: Any,
    framework: Framework,
    mixed_model: Any,
    names: list[str],
    rows: list[np.ndarray],
    originals: dict[str, str] | None = None,
) -> list[tuple[str, float]]:
    """(layer, sensitivity) for each plan name, most sensitive first.

    Each 16-bit layer of `mixed_model` runs alone on what the float32 model
    fed it (its first call, nested layers included), against a float32 twin
    with the same state on the same inputs; sensitivity = rms error / rms
    spread of the float32 output across rows (inf when it overflows).
    `originals` maps a plan name to the original model's layer path (a
    split head's 16-bit part is NAME_linear). Layers that cannot run alone
    rank 0: the grow step still reaches them.
    """
    originals = originals or {}
    first_calls: dict[str, Call] = {}
    for call in trace(original, rows):
        first_calls.setdefault(call.path, call)
    scores = []
    for name in names:
        first = first_calls.get(originals.get(name, name))
        try:
            if first is None:
                raise KeyError(name)
            call = first
            layer16 = layer_at(mixed_model, name)
            twin = _float32_twin(layer16)
            twin(*call.args, **call.kwargs)
            framework.copy_layer_state(layer16, twin)
            out32 = np.asarray(_as_list(twin(*call.args, **call.kwargs))[0], dtype=np.float64)
            out16 = np.asarray(_as_list(layer16(*call.args, **call.kwargs))[0], dtype=np.float64)
        except Exception:  # a layer that needs its neighbours (masks, states): no score
            scores.append((name, 0.0))
            continue
        scores.append((name, sensitivity(out32, out16)))
    return sorted(scores, key=lambda item: -item[1])


def search(
    context: Context,
    loaded: Loaded,
    plan: Plan,
    goal: Goal,
    smoke: list[np.ndarray],
    mixed_model: Any,
    originals: dict[str, str] | None,
) -> Search:
    """The smallest set of plan layers to keep float32 so that `goal.verdict` passes."""
    started = time.perf_counter()
    original, framework = loaded.model, loaded.framework
    config, cls = model_config(original), model_class(original)
    candidates = list(plan.mixed)
    rows = [x[:256] for x in context.data.validation.inputs]
    ranking = rank(original, framework, mixed_model, candidates, rows, originals)

    def predict_keeping(kept: list[str]) -> list[np.ndarray]:
        mixed = set(candidates) - set(kept)
        model = rebuild_with(original, framework, config, cls, plan, mixed, smoke)
        return predict(model, context.data.validation.inputs)

    return search_ranked(context, ranking, predict_keeping, goal, started)
