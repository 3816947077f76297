"""The one model interface: what the pipeline asks of a Keras model and of a plain SavedModel's graph alike.

A `ModelKind` is a loaded float32 model (read, never modified) together
with everything that differs between kinds: its signature and tasks, how to
run it (`runner`), the units the numeric lint and the search work on
(layers or nodes, named by `format.unit` in every message), the plan and
the rewrite with a keep set, the float32 fidelity proof that comes with
every rewrite, the export, and what the kind can do at all
(`capabilities`). The pipeline holds the stage order and skips a stage a
kind lacks, saying which and why; no code outside a kind's own module asks
which kind it has.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..artifacts import OnnxFile, Writer
from ..context import Context
from ..fidelity import Fidelity
from ..finetune import Finetune, StepCallback
from ..formats import ModelFormat
from ..numerics.lint import Lint
from ..numerics.search import Goal, Search
from ..options import ExportOptions, FinetuneOptions, PadOptions, RewriteOptions
from ..pad import Padding, PadPlan
from ..precision import Precision
from ..runners.base import Runner
from ..sections import Layer, Source
from ..signature import Signature
from ..tasks import Task


class Capability(StrEnum):
    """A stage (or part of one) that not every kind can do."""

    FINETUNE = "finetune"
    PAD = "pad"
    ACTIVATION_MEMORY = "activation memory"
    INSPECT = "inspect"  # `mpconvert inspect`'s per-layer plan


class Decision(Protocol):
    """One unit's policy: a Keras layer's (rewrite.LayerDecision) or a graph node's (frozen.rewrite.NodeDecision)."""

    name: str
    class_name: str
    policy: str | None
    pinned: str | None


class Plan(Protocol):
    """Every unit's decision; `as_layers` gives them as the report's `layers`."""

    @property
    def decisions(self) -> tuple[Any, ...]: ...

    @property
    def rows(self) -> tuple[Any, ...]:
        """The decisions as tables list them (a Keras plan adds the sublayers inside its layers)."""
        ...

    def as_layers(self) -> tuple[Layer, ...]: ...


class Candidate(Protocol):
    """A rewritten model: what runs and exports, its plan, and the proof that its float32 form is the original."""

    @property
    def model(self) -> Any: ...  # a Keras model, or a frozen.freeze.FrozenGraph

    @property
    def plan(self) -> Plan: ...

    @property
    def fidelity(self) -> Fidelity | None: ...


class ModelKind(ABC):
    """A loaded float32 model of one kind."""

    format: ModelFormat
    # The speed stage's paths, in the order the gate judges them; the first
    # is what the slow-kernel probe times.
    paths: tuple[str, ...]
    # What this kind cannot do, and why, in words for the report and errors.
    lacks: dict[Capability, str] = {}
    # Said once before converting (the summary prints it), or None.
    limits: str | None = None

    original: Any  # the loaded float32 model, never modified
    signature: Signature
    tasks: tuple[Task, ...]  # one per output, in the signature's order

    def can(self, capability: Capability) -> bool:
        return capability not in self.lacks

    def release(self) -> None:
        """Let go of the float32 original once nothing after the conversion runs it (the export, when no
        --bench-onnx baseline is exported): a large model's artifacts then re-load into its memory.

        Kinds whose writers read the original keep it (this default: the frozen graph's LiteRT file is
        converted from it)."""
        return None

    @abstractmethod
    def describe(self, path: Path | None) -> Source:
        """The report's `source`: where the model came from, what read it, its inputs and outputs."""

    def scope(self) -> contextlib.AbstractContextManager[None]:
        """The scope every stage that rebuilds or runs this model's rewrites runs in."""
        return contextlib.nullcontext()

    @abstractmethod
    def runner(self, model: Any, path: str | None = None) -> Runner:
        """A runner of the original or of a candidate's model, in memory; `path` one of `paths` for timing."""

    @abstractmethod
    def lint(self, context: Context, options: RewriteOptions) -> tuple[Lint, RewriteOptions]:
        """The numeric lint on the float32 model; the rewrite options with what it flags kept float32."""

    @abstractmethod
    def plan(self, options: RewriteOptions) -> Plan:
        """Every unit's decision under `options`, without building anything."""

    @abstractmethod
    def rewrite(self, options: RewriteOptions, rows: list[np.ndarray]) -> Candidate:
        """The model rewritten under `options`, proven faithful in float32 on `rows`; the original untouched."""

    @abstractmethod
    def search(
        self,
        context: Context,
        candidate: Candidate,
        options: RewriteOptions,
        goal: Goal,
    ) -> tuple[Search, RewriteOptions]:
        """The fewest units to keep float32 so `goal.verdict` passes; the options with them kept (unchanged if none)."""

    def finetune(
        self, context: Context, model: Any, options: FinetuneOptions, seed: int, on_step: StepCallback | None
    ) -> Finetune:
        """Fine-tune the converted `model` in place, with loss scaling where the policy needs it."""
        raise NotImplementedError(self.lacks.get(Capability.FINETUNE, "fine-tuning"))

    def pad(self, model: Any, options: PadOptions, rows: list[np.ndarray], precision: Precision) -> Padding:
        """Pad the converted `model` for Tensor Cores where it is safe and cheap, proven unchanged."""
        raise NotImplementedError(self.lacks.get(Capability.PAD, "padding"))

    def padding_plan(self, model: Any, options: PadOptions) -> PadPlan:
        """What `pad` would pad in the converted `model` (for `mpconvert inspect`), nothing built."""
        raise NotImplementedError(self.lacks.get(Capability.PAD, "padding"))

    def activation_memory(self, model: Any, batch: int, inputs: list[Any]) -> dict | None:
        """The converted `model`'s activation memory against the original's at `batch` rows."""
        raise NotImplementedError(self.lacks.get(Capability.ACTIVATION_MEMORY, "activation memory"))

    @abstractmethod
    def writers(
        self, model: Any, rows: list[np.ndarray], expected: list[np.ndarray], out: Path, options: ExportOptions
    ) -> list[Writer]:
        """What the converted `model` exports under `out`: each writer writes one artifact and re-checks it
        on `rows` against `expected` (the model's own outputs)."""

    @abstractmethod
    def onnx(
        self, model: Any, path: Path, opset: int, io: str = "float32", external_data: int | None = None
    ) -> OnnxFile:
        """An ONNX export of the original or a converted model (also the float32 baseline of --bench-onnx).

        `external_data`: weights over that many bytes go to an external data file (None: the default).
        """

    @abstractmethod
    def output_bytes(self, model: Any, kinds: Sequence[str]) -> int:
        """About how much an output folder with these artifact kinds takes (a floor for the free-space check)."""
