"""A frozen GraphDef in memory: a plain SavedModel's serving signature, imported as a wrapped function.

The graph-level kind rewrites GraphDefs; this runs one, fetching the
signature's outputs or any other tensors (the lint and the node search
read every 16-bit node's output). Each import copies the graph, so the
serving function is imported once per runner.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from mpconvert.runners.base import RUNTIME_TENSORFLOW, RunResult, as_float32
from mpconvert.runners.keras import fetch

PREDICT_BATCH = 256


@dataclass(frozen=True)
class GraphRunner:
    graph_def: Any  # tf.compat.v1.GraphDef
    input_tensors: tuple[str, ...]  # "name:0", one per input in the signature's order
    output_tensors: tuple[str, ...]
    output_names: tuple[str, ...] = ()  # the signature's names for output_tensors
    runtime: str = RUNTIME_TENSORFLOW

    def function(self, tensors: tuple[str, ...] | None = None) -> Callable[..., list]:
        """The graph as a callable on tensors (one per input, in order) returning `tensors` (default: the outputs)."""
        import tensorflow as tf

        graph_def = self.graph_def
        wrapped = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(graph_def, name=""), [])
        graph = wrapped.graph
        return wrapped.prune(
            [graph.get_tensor_by_name(n) for n in self.input_tensors],
            [graph.get_tensor_by_name(n) for n in (tensors or self.output_tensors)],
        )

    @cached_property
    def serving(self) -> Callable[..., list]:
        """`function()` for the signature's outputs, imported once."""
        return self.function()

    def run(self, inputs: Sequence[np.ndarray], tensors: tuple[str, ...] | None = None) -> RunResult:
        """The outputs (or `tensors`) on every row, in batches."""
        import tensorflow as tf

        fn = self.function(tensors) if tensors else self.serving
        chunks = []
        for start in range(0, len(inputs[0]), PREDICT_BATCH):
            feeds = [tf.constant(x[start : start + PREDICT_BATCH]) for x in inputs]
            chunks.append(as_float32(fn(*feeds)))
        outputs = [np.concatenate(parts) for parts in zip(*chunks)]
        return RunResult(outputs, self.runtime, names=tuple(tensors or self.output_names))

    def timer(self, inputs: Sequence[Any]) -> Callable[[], None]:
        import tensorflow as tf

        fn = self.serving
        feeds = [x if tf.is_tensor(x) else tf.constant(x) for x in inputs]
        return lambda: fetch(fn(*feeds))
