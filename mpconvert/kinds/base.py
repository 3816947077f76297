"""The one model interface: what the pipeline asks of a Keras model and of a plain SavedModel's graph alike.

A `ModelKind[M, C]` is a loaded float32 model of type `M` (read, never
modified) together with everything that differs between kinds: its
signature and tasks, how to run it (`runner`), the units the numeric lint
and the search work on (layers or nodes, named by `format.unit` in every
message), the rewrite with a keep set into a candidate `C` (which carries
the float32 fidelity proof that comes with every rewrite), the search over
such candidates, and the export.

The stages not every kind can do are capabilities: `finetuner()`,
`padder()`, `activation_memory_meter()` and `inspector()` each return an
object with the stage's method, or `Unavailable` with the reason, in words
for the report's `skipped` and for errors. So whether a kind can do a stage
and why not are one answer, given by the kind. The protocols here name
kind-neutral types only; a kind's implementations return their own richer
objects (the Keras padder's plan holds the layer widths it will build).
The pipeline holds the stage order and asks for a capability before its
stage; no code outside a kind's own module asks which kind it has.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from mpconvert.data.context import Context
from mpconvert.data.formats import ModelFormat
from mpconvert.data.signature import Signature
from mpconvert.data.tasks import Task
from mpconvert.export.formats.base import OnnxFile, Writes
from mpconvert.numerics.search import Goal, Search
from mpconvert.options.finetune import FinetuneOptions
from mpconvert.options.pad import PadOptions
from mpconvert.options.precision import Precision
from mpconvert.options.rewrite import RewriteOptions
from mpconvert.report.sections import Finetune, Lint, PaddingReport
from mpconvert.report.sections.run import Fidelity, Layer, Source
from mpconvert.report.sections.speed import ActivationMemory
from mpconvert.report.sections.stages import PaddedDim, SkippedDim
from mpconvert.runners.base import Runner
from mpconvert.system.hooks import StepCallback

M = TypeVar("M")  # a kind's model: a Keras model (untyped: Any), a graph.freeze.FrozenGraph
M_co = TypeVar("M_co", covariant=True)
M_contra = TypeVar("M_contra", contravariant=True)
T = TypeVar("T")


class Capability(StrEnum):
    """A stage (or part of one) that not every kind can do."""

    FINETUNE = "finetune"
    PAD = "pad"
    ACTIVATION_MEMORY = "activation memory"
    INSPECT = "inspect"  # `mpconvert inspect`'s per-layer plan


@dataclass(frozen=True)
class Unavailable:
    """What a kind answers for a capability it lacks: why, in words for the report's `skipped` and errors."""

    reason: str


def available(found: T | Unavailable) -> T | None:
    """The capability, or None where the kind lacks it (`ModelKind.lacking` says why)."""
    return None if isinstance(found, Unavailable) else found


class Decision(Protocol):
    """One unit's policy: a Keras layer's (keras.rewrite.LayerDecision) or a graph node's (graph.rewrite.NodeDecision)."""

    @property
    def name(self) -> str: ...

    @property
    def class_name(self) -> str: ...  # a layer's class, a node's op type

    @property
    def policy(self) -> str | None: ...

    @property
    def pinned(self) -> str | None: ...  # why the unit stays float32; None when converted


class Plan(Protocol):
    """Every unit's decision; `as_layers` gives them as the report's `layers`."""

    @property
    def decisions(self) -> tuple[Decision, ...]: ...

    @property
    def rows(self) -> tuple[Decision, ...]:
        """The decisions as tables list them (a Keras plan adds the sublayers inside its layers)."""
        ...

    def as_layers(self) -> tuple[Layer, ...]: ...


class Candidate(Protocol[M_co]):
    """A rewritten model: what runs and exports, its plan, and the proof that its float32 form is the original."""

    @property
    def model(self) -> M_co: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def fidelity(self) -> Fidelity | None: ...


C = TypeVar("C", bound=Candidate[Any])  # a kind's own candidate, which its search takes back


class Finetuner(Protocol[M_contra]):
    def finetune(
        self, context: Context, model: M_contra, options: FinetuneOptions, seed: int, on_step: StepCallback | None
    ) -> Finetune:
        """Fine-tune the converted `model` in place, with loss scaling where the policy needs it."""
        ...


class Padded(Protocol[M_co]):
    """The pad stage's result: the model to export (padded, or the unpadded one when the proof failed)."""

    @property
    def model(self) -> M_co: ...

    @property
    def report(self) -> PaddingReport: ...


class PaddingPlan(Protocol):
    """What padding would do, nothing built (`mpconvert inspect`'s padding table)."""

    @property
    def multiple(self) -> int: ...

    @property
    def flops_overhead(self) -> float: ...  # the padded multiply-adds over the model's, less 1

    @property
    def padded(self) -> tuple[PaddedDim, ...]: ...

    @property
    def skipped(self) -> tuple[SkippedDim, ...]: ...


class Padder(Protocol[M]):
    def pad(self, model: M, options: PadOptions, rows: list[np.ndarray], precision: Precision) -> Padded[M]:
        """Pad the converted `model` for Tensor Cores where it is safe and cheap, proven unchanged."""
        ...

    def plan(self, model: M, options: PadOptions) -> PaddingPlan:
        """What `pad` would pad in the converted `model`, nothing built."""
        ...


class ActivationMemoryMeter(Protocol[M_contra]):
    def measure(self, model: M_contra, batch: int, rows: list[np.ndarray]) -> ActivationMemory | None:
        """The converted `model`'s activation memory against the original's at `batch` rows."""
        ...


class Inspector(Protocol):
    def plan(self, options: RewriteOptions) -> Plan:
        """Every unit's decision under `options`, without building anything (`mpconvert inspect`)."""
        ...


class ModelKind(ABC, Generic[M, C]):
    """A loaded float32 model of one kind: `M` its models' type, `C` its rewrites'."""

    format: ModelFormat
    # The speed stage's paths, in the order the gate judges them; the first
    # is what the slow-kernel probe times.
    paths: tuple[str, ...]
    # Said once before converting (the summary prints it), or None.
    limits: str | None = None

    original: M  # the loaded float32 model, never modified
    signature: Signature
    tasks: tuple[Task, ...]  # one per output, in the signature's order

    @abstractmethod
    def finetuner(self) -> Finetuner[M] | Unavailable:
        """Fine-tuning of this kind's converted models, or why it has none."""

    @abstractmethod
    def padder(self) -> Padder[M] | Unavailable:
        """Tensor-Core padding of this kind's converted models, or why it has none."""

    @abstractmethod
    def activation_memory_meter(self) -> ActivationMemoryMeter[M] | Unavailable:
        """The activation memory of this kind's converted models against the original's, or why it has none."""

    @abstractmethod
    def inspector(self) -> Inspector | Unavailable:
        """`mpconvert inspect`'s per-unit plan, or why this kind is not inspected (the reason follows the path)."""

    def lacking(self) -> dict[Capability, str]:
        """Every capability this kind lacks, and why: what the capabilities themselves answer."""
        found: dict[Capability, object] = {
            Capability.FINETUNE: self.finetuner(),
            Capability.PAD: self.padder(),
            Capability.ACTIVATION_MEMORY: self.activation_memory_meter(),
            Capability.INSPECT: self.inspector(),
        }
        return {c: answer.reason for c, answer in found.items() if isinstance(answer, Unavailable)}

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
    def runner(self, model: M, path: str | None = None) -> Runner:
        """A runner of the original or of a candidate's model, in memory; `path` one of `paths` for timing."""

    @abstractmethod
    def lint(self, context: Context, options: RewriteOptions) -> tuple[Lint, RewriteOptions]:
        """The numeric lint on the float32 model; the rewrite options with what it flags kept float32."""

    @abstractmethod
    def rewrite(self, options: RewriteOptions, rows: list[np.ndarray]) -> C:
        """The model rewritten under `options`, proven faithful in float32 on `rows`; the original untouched."""

    @abstractmethod
    def search(
        self,
        context: Context,
        candidate: C,
        options: RewriteOptions,
        goal: Goal,
    ) -> tuple[Search, RewriteOptions]:
        """The fewest units to keep float32 so `goal.verdict` passes; the options with them kept (unchanged if none)."""

    @abstractmethod
    def writes(self, model: M, rows: list[np.ndarray]) -> Writes:
        """How the converted `model` is written in each artifact format this kind can write (export/formats/);
        `rows` are the validation rows its files are checked on."""

    @abstractmethod
    def onnx(self, model: M, path: Path, opset: int, io: str = "float32", external_data: int | None = None) -> OnnxFile:
        """An ONNX export of the original or a converted model (also the float32 baseline of --bench-onnx).

        `external_data`: weights over that many bytes go to an external data file (None: the default).
        """

    @abstractmethod
    def output_bytes(self, model: M, kinds: Sequence[str]) -> int:
        """About how much an output folder with these artifact kinds takes (a floor for the free-space check)."""
