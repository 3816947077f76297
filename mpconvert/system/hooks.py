"""How a caller watches a conversion: stage starts, fine-tune steps, warnings.

Below the pipeline, so that what displays a run (the terminal, a batch
worker, the Python API's callbacks) need not import the pipeline itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# (step, total, loss, loss scale or None), after each fine-tune step.
StepCallback = Callable[[int, int, float, float | None], None]


@dataclass(frozen=True)
class Hooks:
    stage: Callable[[str], None] = lambda name: None
    finetune_step: StepCallback | None = None
    # Said before converting, e.g. that float16 cannot be fast on this CPU.
    warning: Callable[[str], None] = lambda text: None
    # Said after the output is written, e.g. the MLflow run it was recorded as.
    note: Callable[[str], None] = lambda text: None
    # Whether the caller can run itself again with oneDNN's rewrites off
    # (speed.slow_kernel.Restart): the command line and batch workers can.
    may_restart: bool = False


NO_HOOKS = Hooks()  # a run nobody watches
