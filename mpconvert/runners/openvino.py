"""An OpenVINO IR (model.xml + model.bin) compiled for a device, run through one infer request.

The IR holds a float32-computing graph with float16-compressed weights; the
precision it computes in is the compile's INFERENCE_PRECISION_HINT, which
the runner asks for explicitly: OpenVINO 2026.4's CPU plugin applied the
IR's recorded `runtime_options` PERFORMANCE_HINT but not its
INFERENCE_PRECISION_HINT (an IR recording f32 compiled to bf16 on an AMX
CPU, whose default is bf16). What the compiled model says it runs (its
INFERENCE_PRECISION_HINT and EXECUTION_DEVICES) comes back with every run
(`RunResult.compiled`), so a bf16 file that ran f32 is visible.

openvino is imported by the functions that need it: the package is the
optional extra `mpconvert[openvino]`. No TensorFlow is imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from mpconvert.runners.base import Compiled, RunResult
from mpconvert.system.errors import MpconvertError

RUNTIME_OPENVINO = "openvino"
# Where the IR keeps what mpconvert decided (Model.get_rt_info paths): the hint the conversion machine chose,
# and the 16-bit type the converted model computed in (what a device with those units should run).
HINT_PATH = ["runtime_options", "INFERENCE_PRECISION_HINT"]
COMPUTE_PATH = ["mpconvert", "compute"]
# An inference precision by OpenVINO's name, and the OPTIMIZATION_CAPABILITIES entry a device lists for it.
CAPABILITY = {"bf16": "BF16", "f16": "FP16", "f32": "FP32"}
FALLBACK = "f32"
INSTALL_HINT = "pip install 'mpconvert[openvino]' (or pass --export/--artifacts without openvino)"


def openvino() -> Any:
    """The openvino module, or the error that says how to install it."""
    try:
        import openvino as ov
    except ImportError as exc:
        raise MpconvertError(f"the openvino package is not installed ({exc})", hint=INSTALL_HINT) from None
    return ov


def capabilities(device: str = "CPU") -> frozenset[str]:
    """What `device` lists among OpenVINO's OPTIMIZATION_CAPABILITIES ("BF16", "FP16", "FP32", ...)."""
    try:
        return frozenset(openvino().Core().get_property(device, "OPTIMIZATION_CAPABILITIES"))
    except RuntimeError:  # a device without the property (AUTO) or without its plugin's libraries
        return frozenset()


def supported(precision: str, device: str = "CPU") -> bool:
    return CAPABILITY.get(precision, "?") in capabilities(device)


def precision_name(value: Any) -> str:
    """An OpenVINO element type (ov.Type.bf16) or its name as OpenVINO spells it ("bf16")."""
    return value.to_string() if hasattr(value, "to_string") else str(value)


@dataclass(frozen=True)
class OpenVinoRunner:
    """The IR at `path` (model.xml) compiled for `device`; inputs and outputs by their names in the IR.

    `precision`: the INFERENCE_PRECISION_HINT to compile with; None: the 16-bit type the IR records the
    converted model computed in where `device` lists its units, else f32 (what a serving machine runs).
    AUTO takes no hint (it chooses the device itself).
    """

    path: Path
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    device: str = "CPU"
    precision: str | None = None

    @property
    def runtime(self) -> str:
        return f"{RUNTIME_OPENVINO}:{self.device}"

    @cached_property
    def compiled(self) -> Any:
        ov = openvino()
        core = ov.Core()
        if self.device != "AUTO" and self.device not in core.available_devices:
            raise MpconvertError(
                f"OpenVINO has no {self.device} device here (it has {', '.join(core.available_devices)})",
                hint="pass --ov-device with one of those, or run on the machine with that device",
            )
        model = core.read_model(str(self.path))
        hint = self.precision or self.wanted(model)
        config = {"INFERENCE_PRECISION_HINT": hint} if hint and self.device != "AUTO" else {}
        return core.compile_model(model, self.device, config)

    def wanted(self, model: Any) -> str | None:
        """The precision a device runs this IR in: the converted model's 16-bit type where it has the units."""
        if self.device == "AUTO" or not model.has_rt_info(COMPUTE_PATH):
            return None
        compute = str(model.get_rt_info(COMPUTE_PATH).astype(str))
        return compute if supported(compute, self.device) else FALLBACK

    def ran(self) -> Compiled:
        """What the compiled model says it runs."""
        compiled = self.compiled
        try:
            precision = precision_name(compiled.get_property("INFERENCE_PRECISION_HINT"))
        except RuntimeError:  # AUTO answers for no precision of its own
            precision = None
        return Compiled(precision, tuple(compiled.get_property("EXECUTION_DEVICES")))

    def run(self, inputs: Sequence[np.ndarray]) -> RunResult:
        request = self.compiled.create_infer_request()
        results = request.infer(self._feeds(inputs))
        # The request owns the arrays it returns (the next call overwrites them): copied here.
        got = [np.array(results[self._output(name)], dtype=np.float32, copy=True) for name in self.outputs]
        return RunResult(got, self.runtime, names=self.outputs, compiled=self.ran())

    def timer(self, inputs: Sequence[np.ndarray]) -> Callable[[], None]:
        request, feeds = self.compiled.create_infer_request(), self._feeds(inputs)

        def call() -> None:
            request.infer(feeds)

        return call

    def _output(self, name: str) -> Any:
        return self.compiled.output(name)

    def _feeds(self, inputs: Sequence[np.ndarray]) -> dict:
        return {self.compiled.input(name): np.ascontiguousarray(x) for name, x in zip(self.inputs, inputs)}
