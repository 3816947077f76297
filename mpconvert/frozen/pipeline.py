"""The graph-level path: a SavedModel without Keras layers, converted as a frozen graph.

load (freeze the signature) -> prove the frozen graph is the signature ->
rewrite (frozen/rewrite.py) -> validate (the same comparison and gate as for
Keras models) in memory; the export is artifacts.export_graph. Fine-tuning
and padding need Keras layers and are not available here: the report and
the summary say so, and --finetune-steps N > 0 is refused. The numeric lint
runs at node level (float32 node outputs beyond the 16-bit range stay
float32, with their readers), then the accuracy-driven search over nodes
(frozen/search.py) when the gate still fails; --keep-float32 names nodes or
op types. The slow-kernel guard and the speed stage time the imported
serving graph, which the exported SavedModel runs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..context import Context
from ..data import Task, evaluation_data
from ..errors import MpconvertError
from ..fidelity import Fidelity, limit_for
from ..numerics.autokeep import passes, search_reason
from ..numerics.lint import OVERFLOW_MARGIN
from ..options import LINT_ROWS, PARITY_SAMPLES, ConvertOptions
from ..report import Report
from ..speed import measure_speed, target_note, warning_for
from ..speed.slow_kernel import guard
from ..validate import judge, judging, max_abs_diff
from .freeze import FrozenGraph, load_frozen
from .rewrite import PASS_THROUGH, candidates, overflowing, rewrite_graph
from .search import search_nodes

LIMITS = (
    "graph-level: no Keras layers, so no fine-tuning and no padding; the numeric lint and the accuracy-driven "
    "search work on graph nodes; --keep-float32 names nodes or op types"
)


@dataclass(frozen=True)
class GraphPlan:
    decisions: tuple  # frozen.rewrite.NodeDecision per compute node


@dataclass(frozen=True)
class GraphLoaded:
    """What the save stage reads of a loaded model, for a graph (nothing to deserialize)."""

    model: FrozenGraph
    format: str = "graph"

    def deserialization(self):
        return contextlib.nullcontext()


def tasks_of_graph(model: FrozenGraph) -> tuple[Task, ...]:
    """Each output's task, from the op that produces it: Softmax, Sigmoid, else regression."""
    nodes = {n.name: n for n in model.graph_def.node}
    tasks = []
    for spec, ref in zip(model.outputs, model.output_tensors):
        node = nodes.get(ref.partition(":")[0])
        while node is not None and node.op in PASS_THROUGH and node.input:
            node = nodes.get(node.input[0].lstrip("^").partition(":")[0])
        op = node.op if node is not None else ""
        kind = {"Softmax": "softmax", "LogSoftmax": "softmax", "Sigmoid": "sigmoid"}.get(op, "regression")
        tasks.append(Task(kind, spec))
    return tuple(tasks)


def _signature_outputs(model: FrozenGraph, rows: list[np.ndarray]) -> list[np.ndarray]:
    """The SavedModel's own signature on `rows`: what the frozen graph must reproduce."""
    import tensorflow as tf

    result = model.source(**{spec.name: tf.constant(x) for spec, x in zip(model.inputs, rows)})
    return [np.asarray(result[spec.name], dtype=np.float32) for spec in model.outputs]


def lint_nodes(original: FrozenGraph, rows: list[np.ndarray], precision: Any) -> dict[str, str]:
    """{node: why} for the float32 node outputs beyond the format's range on `rows`, with their readers."""
    names = candidates(original.graph_def)
    values = original.predict(rows, tensors=tuple(f"{n}:0" for n in names)) if names else []
    largest = {n: float(np.abs(v[np.isfinite(v)]).max(initial=0.0)) for n, v in zip(names, values)}
    return overflowing(original.graph_def, largest, precision.max_finite * OVERFLOW_MARGIN)


def convert_graph(options: ConvertOptions, clock: Any) -> tuple[FrozenGraph, GraphPlan, Context, GraphLoaded, Report]:
    """Every stage up to the export, for a SavedModel without Keras metadata."""
    precision = options.precision
    path = options.load.path
    if options.finetune.steps:
        raise MpconvertError(
            f"{path} is a SavedModel without Keras layers: it is converted as a frozen graph, which cannot be "
            "fine-tuned",
            hint="pass --finetune-steps 0 (the default when the data has no training split)",
        )
    with clock.stage("load"):
        original = load_frozen(path, options.load.signature)
        signature = original.signature
        tasks = tasks_of_graph(original)
        data = evaluation_data(original, signature, tasks, options.validate, options.seed)
        metrics, thresholds = judging(options, tasks, data)
    warning = warning_for(precision) if options.speed else None  # after the load, as for Keras models
    if warning:
        clock.hooks.warning(warning)
    rows = [x[:PARITY_SAMPLES] for x in data.validation.inputs]
    with clock.stage("rewrite"):
        reference = original.predict(data.validation.inputs)  # the proof's rows and the validation's, at once
        frozen = [o[: len(rows[0])] for o in reference]
        expected = _signature_outputs(original, rows)
        diff = max_abs_diff(expected, frozen)
        fidelity = Fidelity(rows=len(rows[0]), max_abs_diff=diff, limit=limit_for(expected))
        if diff is None or diff > fidelity.limit:
            raise MpconvertError(
                f"the frozen graph of {path} does not reproduce its signature (max |diff| {diff} > {fidelity.limit:g})",
                hint="rerun with --debug and report it, with the SavedModel",
            )
        keep = lint_nodes(original, rows, precision) if options.auto_keep.mode != "off" else {}

        def rewrite_keeping(kept: dict[str, str]) -> tuple[FrozenGraph, list]:
            graph_def, decisions = rewrite_graph(
                original.graph_def, original.output_tensors, precision.compute_dtype, options.rewrite.keep_float32, kept
            )
            return original.with_graph(graph_def), decisions

        converted, decisions = rewrite_keeping(keep)
    context = Context(original, None, signature, tasks, metrics, data, precision)
    with clock.stage("kernel check"):  # before any minutes go into a broken kernel
        rows_all = list(data.validation.inputs)
        slow = guard(precision.name, original, converted, signature, rows_all, clock.hooks.may_restart)
    with clock.stage("validate"):
        validation = judge(context, reference, converted.predict(data.validation.inputs))
    searched = None
    if options.auto_keep.mode == "search" and not passes(validation.as_dict(), thresholds):
        with clock.stage("search"):
            searched = search_nodes(
                context,
                converted,
                decisions,
                lambda kept: rewrite_keeping({**keep, **dict.fromkeys(kept, "accuracy-driven search: trial")})[0],
                reference,
                lambda v: passes(v, thresholds),
                options.auto_keep.search_budget,
                [x[:LINT_ROWS] for x in data.validation.inputs],
            )
        if searched.validation is not None:
            reason = search_reason(validation.as_dict(), searched.validation)
            with clock.stage("rewrite"):
                converted, decisions = rewrite_keeping({**keep, **dict.fromkeys(searched.kept, reason)})
            with clock.stage("validate"):
                validation = judge(context, reference, converted.predict(data.validation.inputs))
    speed = None
    if options.speed:
        with clock.stage("speed"):
            speed = measure_speed(
                original,
                converted,
                list(data.validation.inputs),
                signature=signature,
                batch=options.speed_batch,
                paths=("savedmodel",),
                memory=False,
            )
    layers = [
        {
            "name": d.name,
            "class_name": d.class_name,
            "policy": precision.name if d.policy else "float32",
            "pinned": d.pinned,
        }
        for d in decisions
    ]
    names = [spec.name for spec in signature.inputs]
    report = Report(
        policy=precision.name,
        source={
            "path": str(path),
            "name": original.name,
            "parameters": None,
            "format": "graph",
            "loader": f"tensorflow (signature {original.signature_name!r}, inputs {', '.join(names)})",
            "inputs": [vars(s) for s in signature.inputs],
            "outputs": [vars(s) for s in signature.outputs],
        },
        layers=layers,
        fidelity=fidelity.as_dict(),
        validation=validation.as_dict(),
        thresholds=thresholds,
        auto_keep={
            "mode": options.auto_keep.mode,
            "lint": (
                {
                    "rows": len(rows[0]),
                    "findings": [
                        {
                            "layer": node,
                            "kind": "overflow" if why.startswith("numeric") else "reads overflow",
                            "message": why,
                            "values": {},
                        }
                        for node, why in keep.items()
                    ],
                    "kept": sorted(keep),
                }
                if options.auto_keep.mode != "off"
                else None
            ),
            "search": searched.as_dict() if searched else None,
            "note": LIMITS,
        },
        speed=(
            {**speed.as_dict(), "warning": warning, "target_note": target_note(precision), "padding": None}
            if speed
            else None
        ),
        slow_kernel=slow,
        timings=clock.timings,
    )
    return converted, GraphPlan(tuple(decisions)), context, GraphLoaded(original), report
