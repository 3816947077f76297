"""`mpconvert verify`'s options: how an output folder is run on the machine where it will serve."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mpconvert.options.artifact_kinds import EXPORT_KINDS
from mpconvert.options.export import check_export_kinds
from mpconvert.options.keywords import Keyword, check_ranges, keyword, table
from mpconvert.system.errors import MpconvertError

# --provider of `verify`: ONNX Runtime's execution providers by the word a user types.
PROVIDER_WORDS = ("auto", "cpu", "cuda", "tensorrt")
# --ov-device of `verify`: OpenVINO's device names (AUTO: OpenVINO chooses, and takes no precision hint).
OV_DEVICES = ("CPU", "GPU", "NPU", "AUTO")


@dataclass(frozen=True)
class VerifyOptions:
    """`mpconvert verify`: how to run an output folder's artifacts on the machine where it will serve."""

    provider: str = keyword(
        "auto",
        choices=PROVIDER_WORDS,
        help="ONNX Runtime provider for the .onnx file; auto: the best that really loads here (TensorRT, CUDA, CPU).",
    )
    fallback: bool = keyword(
        False,
        kind="bool",
        help="Run on the CPU provider (and say so) when --provider cuda|tensorrt does not load here, "
        "instead of failing.",
    )
    ov_device: str = keyword(
        "CPU",
        choices=OV_DEVICES,
        help="OpenVINO device for the openvino artifact; it is compiled for the 16-bit type the model was "
        "converted to where the device lists the units for it (BF16, FP16), else for f32, and the run says which.",
    )
    speed_batch: int | None = keyword(
        None,
        kind="int",
        minimum=1,
        metavar="N",
        default_text="the batch the conversion timed",
        help="Rows per timed call (a serving batch); the golden rows are repeated up to it.",
    )
    artifacts: tuple[str, ...] = keyword(
        EXPORT_KINDS,
        kind="kinds",
        choices=EXPORT_KINDS,
        help="The artifacts to verify, the ones this machine will serve (comma-separated; savedmodel includes "
        "model.keras); the others are neither hashed nor run.",
    )

    public_key: Path | None = keyword(
        None,
        kind="path",
        metavar="KEY.pub",
        default_text="the signature is not checked",
        help="Check the folder's signature (model.sig) with this public key first, before any hash or run: "
        "a missing, broken or other key's signature fails, and an artifact of a folder whose signature fails is "
        "not loaded.",
    )
    require_signature: bool = keyword(
        False,
        kind="bool",
        help="Fail every folder whose signature is not checked here: an unsigned one, or any without --public-key.",
    )

    def __post_init__(self) -> None:
        check_ranges(self)
        check_export_kinds(self.artifacts)
        if self.public_key is not None:
            key = Path(self.public_key)
            object.__setattr__(self, "public_key", key)
            if not key.is_file():
                raise MpconvertError(
                    f"--public-key {key}: no such file",
                    hint="give the PEM file of the public key the folder was signed for",
                )


VERIFY_KEYWORDS: dict[str, Keyword] = table(VerifyOptions)
