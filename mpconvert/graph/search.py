"""The accuracy-driven search at node level: the fewest compute nodes to keep float32 so the gate holds.

The same grow-and-prune search as for Keras layers (numerics/search.py),
over the graph's 16-bit allow nodes (MatMul, Conv2D, ...): keeping one
float32 also keeps the cheap infer ops that only followed it into 16 bits.

Ranking takes two runs, not one per node: the float32 graph and the
rewritten graph, both fetching every 16-bit node's output on the same rows.
A node's own error is how much the error at its output (rms difference
over the rms spread of its float32 values across rows) exceeds the largest
error it was fed; an allow node is charged its own error and that of the
infer ops that follow it, since keeping it float32 removes both. A node
whose 16-bit output is not finite ranks first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from mpconvert.data.context import Context
from mpconvert.graph.freeze import FrozenGraph
from mpconvert.graph.rewrite import ALLOW, NodeDecision, producer
from mpconvert.numerics.search import Goal, Search, search_ranked, sensitivity


def rank_nodes(
    original: FrozenGraph, converted: FrozenGraph, decisions: list[NodeDecision], rows: list[np.ndarray]
) -> list[tuple[str, float]]:
    """(allow node, sensitivity) for each 16-bit allow node, most sensitive first."""
    sixteen = [d.name for d in decisions if d.policy]
    if not sixteen:
        return []
    tensors = tuple(f"{name}:0" for name in sixteen)
    errors = {
        name: sensitivity(ref, got)
        for name, ref, got in zip(
            sixteen, original.predict(rows, tensors=tensors), converted.predict(rows, tensors=tensors)
        )
    }
    nodes = {n.name: n for n in original.graph_def.node}
    owner: dict[str, str] = {}  # a 16-bit node -> the allow node it follows into 16 bits
    charged: dict[str, float] = {}
    for name in sixteen:  # graph_def order: a node's producers come first
        node = nodes[name]
        fed = [producer(r)[0] for r in node.input if not r.startswith("^")]
        fed_sixteen = [p for p in fed if p in errors]
        own = errors[name] - max((errors[p] for p in fed_sixteen), default=0.0)
        own = math.inf if math.isnan(own) or errors[name] == math.inf else max(own, 0.0)
        owner[name] = name if node.op in ALLOW else next((owner[p] for p in fed_sixteen if p in owner), name)
        charged[owner[name]] = charged.get(owner[name], 0.0) + own
    ranked = [(name, charged.get(name, 0.0)) for name in sixteen if nodes[name].op in ALLOW]
    return sorted(ranked, key=lambda item: -item[1])


def search_nodes(
    context: Context,
    original: FrozenGraph,
    converted: FrozenGraph,
    decisions: list[NodeDecision],
    rewrite_keeping: Callable[[list[str]], FrozenGraph],
    goal: Goal,
    rows: list[np.ndarray],
) -> Search:
    """The fewest allow nodes to keep float32 so that `goal.verdict` passes; `rewrite_keeping(kept)` rewrites."""
    started = time.perf_counter()
    ranking = rank_nodes(original, converted, decisions, rows)
    inputs = context.data.validation.inputs

    def predict_keeping(kept: list[str]) -> list[np.ndarray]:
        return rewrite_keeping(kept).predict(inputs)

    return search_ranked(context, ranking, predict_keeping, goal, started)
