"""The frozen-graph kind: a SavedModel without Keras metadata, whose units are compute nodes.

Keras 3's `model.export()`, `tf.saved_model.save` of a tf.Module, TF Hub
and TF Serving models carry no Keras layers: one serving signature is
frozen into a GraphDef (freeze.py), which must reproduce the
signature before anything else (the float32 fidelity proof); the rewrite
is the allow/infer/deny 16-bit pass over its nodes (rewrite.py),
the numeric lint keeps nodes whose float32 outputs pass the 16-bit range
(with their readers), and the accuracy-driven search ranks nodes
(search.py). Fine-tuning, padding, activation memory and `mpconvert
inspect` need Keras layers: this kind answers each with the reason it
lacks it (`Unavailable`), and the pipeline says so. The speed stage and the slow-kernel
probe time the imported serving graph, which the exported SavedModel runs.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mpconvert.data.context import Context
from mpconvert.data.formats import ModelFormat
from mpconvert.data.signature import Signature
from mpconvert.data.tasks import Task, TaskKind, padding_of
from mpconvert.export.artifacts import OVERHEAD
from mpconvert.export.formats.base import LiteRTFile, OnnxFile
from mpconvert.export.formats.litert import write_litert
from mpconvert.graph.freeze import FrozenGraph
from mpconvert.graph.rewrite import PASS_THROUGH, NodeDecision, candidates, overflowing, rewrite_graph
from mpconvert.graph.search import search_nodes
from mpconvert.kinds.base import ModelKind, Unavailable
from mpconvert.numerics.search import Goal, Search, search_reason
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.options.export import ExportOptions
from mpconvert.options.precision import Precision
from mpconvert.options.rewrite import LINT_ROWS, RewriteOptions
from mpconvert.options.tolerance import Tolerance
from mpconvert.options.validate import PARITY_SAMPLES
from mpconvert.report.compare import compare
from mpconvert.report.sections import Fidelity, Finding, Layer, Lint, Source
from mpconvert.runners.graph import GraphRunner
from mpconvert.system.errors import MpconvertError

LIMITS = (
    "graph-level: no Keras layers, so no fine-tuning and no padding; the numeric lint and the accuracy-driven "
    "search work on graph nodes; --keep-float32 names nodes or op types"
)
_NO_LAYERS = "a SavedModel without Keras layers is converted as a frozen graph"


@dataclass(frozen=True)
class GraphPlan:
    decisions: tuple[NodeDecision, ...]  # one per compute node
    policy: str

    @property
    def rows(self) -> tuple[NodeDecision, ...]:
        return self.decisions

    def as_layers(self) -> tuple[Layer, ...]:
        return tuple(
            Layer(d.name, d.class_name, self.policy if d.policy else "float32", d.pinned) for d in self.decisions
        )


@dataclass(frozen=True)
class GraphCandidate:
    model: FrozenGraph
    plan: GraphPlan
    fidelity: Fidelity | None


def tasks_of_graph(model: FrozenGraph) -> tuple[Task, ...]:
    """Each output's task, from the op that produces it: Softmax, Sigmoid, else regression."""
    nodes = {n.name: n for n in model.graph_def.node}
    tasks = []
    for spec, ref in zip(model.outputs, model.output_tensors):
        node = nodes.get(ref.partition(":")[0])
        while node is not None and node.op in PASS_THROUGH and node.input:
            node = nodes.get(node.input[0].lstrip("^").partition(":")[0])
        op = node.op if node is not None else ""
        kind = {"Softmax": TaskKind.SOFTMAX, "LogSoftmax": TaskKind.SOFTMAX, "Sigmoid": TaskKind.SIGMOID}
        padding = padding_of(spec, model.inputs)  # by input name: a graph has no Keras layers
        tasks.append(Task(kind.get(op, TaskKind.REGRESSION), spec, logits=op == "LogSoftmax", padding=padding))
    return tuple(tasks)


# Why this kind lacks each stage that needs Keras layers (the report's `skipped`, and the refusals).
NO_FINETUNE = Unavailable(f"{_NO_LAYERS}, which cannot be fine-tuned")
NO_PAD = Unavailable(f"{_NO_LAYERS}: padding rewrites Keras layers")
NO_ACTIVATION_MEMORY = Unavailable(f"{_NO_LAYERS}: activation memory is computed from layer shapes")
NO_INSPECT = Unavailable(
    "is a SavedModel without Keras metadata (no keras_metadata.pb): it has no Keras layers "
    "to inspect; the main command converts it at graph level (mpconvert MODEL --policy ...)"
)


class GraphKind(ModelKind[FrozenGraph, GraphCandidate]):
    format = ModelFormat.GRAPH
    paths = ("savedmodel",)
    limits = LIMITS

    def __init__(self, original: FrozenGraph, path: Path):
        self.original = original
        self.path = path
        self.signature = original.signature
        self.tasks = tasks_of_graph(original)
        self._fidelity: Fidelity | None = None

    def finetuner(self) -> Unavailable:
        return NO_FINETUNE

    def padder(self) -> Unavailable:
        return NO_PAD

    def activation_memory_meter(self) -> Unavailable:
        return NO_ACTIVATION_MEMORY

    def inspector(self) -> Unavailable:
        return NO_INSPECT

    def describe(self, path: Path | None) -> Source:
        names = [spec.name for spec in self.signature.inputs]
        return Source(
            path=str(path),
            name=self.original.name,
            parameters=None,
            format=self.format,
            loader=f"tensorflow (signature {self.original.signature_name!r}, inputs {', '.join(names)})",
            inputs=self.signature.inputs,
            outputs=self.signature.outputs,
        )

    def runner(self, model: FrozenGraph, path: str | None = None) -> GraphRunner:
        # One way to run whatever the path: the imported serving graph, which the exported SavedModel serves.
        return model.runner

    def lint(self, context: Context, options: RewriteOptions) -> tuple[Lint, RewriteOptions]:
        """Float32 node outputs beyond the format's range on the validation rows stay float32, with their readers."""
        rows = [x[:PARITY_SAMPLES] for x in context.data.validation.inputs]
        names = candidates(self.original.graph_def)
        values = self.original.predict(rows, tensors=tuple(f"{n}:0" for n in names)) if names else []
        largest = {n: float(np.abs(v[np.isfinite(v)]).max(initial=0.0)) for n, v in zip(names, values)}
        limit = context.precision.overflow_limit
        keep = overflowing(self.original.graph_def, largest, limit)
        findings = tuple(
            Finding(node, "overflow" if why.startswith("numeric") else "reads overflow", why)
            for node, why in keep.items()
        )
        return Lint(len(rows[0]), findings), dataclasses.replace(
            options, auto_keep=options.auto_keep + tuple(keep.items())
        )

    def _rewritten(self, options: RewriteOptions) -> tuple[FrozenGraph, GraphPlan]:
        precision = Precision.of(options.policy)
        graph_def, decisions = rewrite_graph(
            self.original.graph_def,
            self.original.output_tensors,
            precision.compute_dtype,
            options.keep_float32,
            dict(options.auto_keep),
        )
        return self.original.with_graph(graph_def), GraphPlan(tuple(decisions), precision.name)

    def rewrite(self, options: RewriteOptions, rows: list[np.ndarray]) -> GraphCandidate:
        model, plan = self._rewritten(options)
        if self._fidelity is None:  # the same frozen graph under every rewrite: proven once
            self._fidelity = self._prove(rows)
        return GraphCandidate(model, plan, self._fidelity)

    def _prove(self, rows: list[np.ndarray]) -> Fidelity:
        """The frozen graph reproduces the SavedModel's own signature on `rows`."""
        found = compare(
            self.original.signature_outputs(rows), self.original.predict(rows), Tolerance.float32_rounding()
        )
        if not found.passed or found.max_abs_diff is None:
            raise MpconvertError(
                f"the frozen graph of {self.path} does not reproduce its signature "
                f"(max |diff| {found.shown} > {found.limit:g})",
                hint="rerun with --debug and report it, with the SavedModel",
            )
        return Fidelity(rows=len(rows[0]), max_abs_diff=found.max_abs_diff, limit=found.limit)

    def search(
        self,
        context: Context,
        candidate: GraphCandidate,
        options: RewriteOptions,
        goal: Goal,
    ) -> tuple[Search, RewriteOptions]:
        def rewrite_keeping(kept: list[str]) -> FrozenGraph:
            trial = options.auto_keep + tuple((name, "accuracy-driven search: trial") for name in kept)
            return self._rewritten(dataclasses.replace(options, auto_keep=trial))[0]

        rows = [x[:LINT_ROWS] for x in context.data.validation.inputs]
        decisions = list(candidate.plan.decisions)
        found = search_nodes(context, self.original, candidate.model, decisions, rewrite_keeping, goal, rows)
        if found.validation is None:
            return found, options
        reason = search_reason(goal.before, found.validation)
        return found, dataclasses.replace(options, auto_keep=options.auto_keep + tuple((k, reason) for k in found.kept))

    def writes(self, model: FrozenGraph, rows: list[np.ndarray]) -> GraphWrites:
        return GraphWrites(self, model)

    def onnx(
        self, model: FrozenGraph, path: Path, opset: int, io: str = "float32", external_data: int | None = None
    ) -> OnnxFile:
        """A frozen graph holds its weights as constants: one file (`external_data` applies to Keras models)."""
        from mpconvert.onnx.export import graph_to_onnx

        exported = graph_to_onnx(
            model.graph_def, model.input_tensors, model.output_tensors, path, opset=opset, unit_of=self.node_of, io=io
        )
        return OnnxFile(exported, tuple(exported.input_names), tuple(model.output_tensors))

    def node_of(self, onnx_node: str) -> str | None:
        """The graph node an ONNX node was converted from, where it is one --keep-float32 can name."""
        name = onnx_node.partition(":")[0]
        return name if name in set(candidates(self.original.graph_def)) else None

    def output_bytes(self, model: FrozenGraph, kinds: Sequence[str]) -> int:
        """The frozen graph once per artifact that holds it."""
        copies = ("savedmodel" in kinds) + ("onnx" in kinds) + 0.5 * ("openvino" in kinds)  # the IR: float16 weights
        return int(model.graph_def.ByteSize() * copies) + OVERHEAD


@dataclass(frozen=True)
class GraphWrites:
    """How a frozen graph is written in each format (export/formats/): no model.keras, it has no Keras layers."""

    kind: GraphKind
    model: FrozenGraph

    @property
    def signature(self) -> Signature:
        return self.model.signature

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(ArtifactKind) - {ArtifactKind.KERAS}

    def savedmodel(self, path: Path) -> str:
        self.model.save(path)
        return self.model.signature_name

    def keras(self, path: Path) -> None:
        raise NotImplementedError("a frozen graph has no Keras layers to write model.keras from (not in `kinds`)")

    def onnx(self, path: Path, options: ExportOptions) -> OnnxFile:
        # A frozen graph holds its weights as constants: one file (--onnx-external-data applies to Keras models).
        return self.kind.onnx(self.model, path, options.opset, options.onnx_io)

    def litert(self, path: Path) -> LiteRTFile:
        # A graph-level conversion neither fine-tunes nor pads: the float32 original holds its weights.
        with tempfile.TemporaryDirectory(prefix="mpconvert-litert-") as tmp:
            self.kind.original.save(Path(tmp) / "float32", empty="pad")
            return write_litert(Path(tmp) / "float32", path)
