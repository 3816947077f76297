"""What judging a conversion needs, for every kind of model.

The stages take this one small value instead of five positional
arguments; it is built once, right after loading, and never changes. What
only one kind has (a Keras model's framework, its saved loss) travels with
that kind (load.Loaded), not here.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpconvert.data.rows import EvalData
from mpconvert.data.signature import Signature
from mpconvert.data.tasks import Task
from mpconvert.options.precision import Precision
from mpconvert.options.validate import Metric


@dataclass(frozen=True)
class Context:
    signature: Signature
    tasks: tuple[Task, ...]  # one per output, in the signature's order
    metrics: tuple[Metric, ...]  # the metric each output is scored by (when it has labels)
    data: EvalData
    precision: Precision

    def __post_init__(self) -> None:
        # One output's task and metric may be given as they are.
        if isinstance(self.tasks, Task):
            object.__setattr__(self, "tasks", (self.tasks,))
        if isinstance(self.metrics, str):
            object.__setattr__(self, "metrics", (self.metrics,) * len(self.tasks))
        object.__setattr__(self, "metrics", tuple(Metric(m) for m in self.metrics))
