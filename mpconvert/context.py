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
    task: Task
    metric: str
    data: EvalData
    precision: Precision
    saved_loss: Any = None  # the loss the model was compiled with, if stored
