"""What every stage after loading knows about the conversion at hand.

The stages take this one small value instead of seven to ten positional
arguments; it is built once, right after loading, and never changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .data import EvalData, Task
from .frameworks import Framework
from .precision import Precision
from .signature import Signature


@dataclass(frozen=True)
class Context:
    original: Any  # the float32 model: read, never modified
    framework: Framework
    signature: Signature
    tasks: tuple[Task, ...]  # one per output, in the signature's order
    metrics: tuple[str, ...]  # the metric each output is scored by (when it has labels)
    data: EvalData
    precision: Precision
    saved_loss: Any = None  # the loss the model was compiled with, if stored

    def __post_init__(self) -> None:
        # One output's task and metric may be given as they are.
        if isinstance(self.tasks, Task):
            object.__setattr__(self, "tasks", (self.tasks,))
        if isinstance(self.metrics, str):
            object.__setattr__(self, "metrics", (self.metrics,) * len(self.tasks))
