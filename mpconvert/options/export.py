"""What a conversion writes: which artifacts and how (`ExportOptions`), and where (`SaveOptions`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpconvert.options.artifact_kinds import DEFAULT_EXPORT, EXPORT_KINDS
from mpconvert.options.keywords import Keyword, check_ranges, keyword, table
from mpconvert.options.signing import SigningOptions
from mpconvert.options.tracking import TrackingOptions
from mpconvert.options.validate import PARITY_SAMPLES
from mpconvert.system.errors import MpconvertError
from mpconvert.system.urls import is_url, output_url

# tf2onnx 1.17 writes opsets 13 to 18. 17 is the newest TensorRT 8.x and
# most mobile runtimes accept, and bfloat16 coverage is the same as at 18.
DEFAULT_OPSET = 17
ONNX_IO = ("float32", "float16")
MIN_OPSET = 13  # the first opset with bfloat16 in most op schemas
# Protobuf caps one message at 2 GiB; below that, a one-file ONNX export of a 1.07 GB Dense stack still
# peaked at 17.5x its size (every weight copied by freezing, grappler, tf2onnx and serializing), so the
# weights go to external data from well under the limit.
DEFAULT_ONNX_EXTERNAL_DATA = 512 << 20
MAX_OPSET = 18


@dataclass(frozen=True)
class ExportOptions:
    kinds: tuple[str, ...] = keyword(
        DEFAULT_EXPORT,
        name="export",
        kind="kinds",
        choices=EXPORT_KINDS,
        help="Artifacts to write, comma-separated (litert: model.tflite with float16 weights).",
    )
    opset: int = keyword(
        DEFAULT_OPSET,
        kind="int",
        minimum=MIN_OPSET,
        maximum=MAX_OPSET,
        help=f"ONNX opset of the .onnx file (tf2onnx 1.17 writes {MIN_OPSET} to {MAX_OPSET}).",
    )
    onnx_io: str = keyword(
        "float32",
        choices=ONNX_IO,
        help="Element type of the .onnx file's float inputs and outputs: float16 halves what a GPU server "
        "moves (integer and string inputs stay as they are).",
    )
    onnx_external_data: int = keyword(
        DEFAULT_ONNX_EXTERNAL_DATA,
        kind="int",
        minimum=0,
        help="Bytes of weights (as the model holds them) over which a Keras 3 model's ONNX file keeps its "
        "weights in model.onnx.data beside it, written one at a time: protobuf caps the .onnx file and the "
        "TensorFlow graph it is converted from at 2 GiB each.",
    )
    parity_samples: int = PARITY_SAMPLES
    bench_onnx: bool = keyword(
        False,
        kind="bool",
        help="Also time the ONNX file against a float32 ONNX export in ONNX Runtime (costs one more export).",
    )

    def __post_init__(self) -> None:
        check_export_kinds(self.kinds)
        check_opset(self.opset)
        check_ranges(self)


def check_export_kinds(kinds: tuple[str, ...]) -> None:
    """Refuse an empty or unknown choice of artifacts; the --export flag's check too."""
    unknown = [k for k in kinds if k not in EXPORT_KINDS]
    if unknown or not kinds:
        raise MpconvertError(
            f"unknown export kind(s) {', '.join(map(repr, unknown)) or '(none given)'}",
            hint=f"choose from {', '.join(EXPORT_KINDS)}, comma-separated",
        )


def check_opset(opset: int) -> None:
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise MpconvertError(
            f"ONNX opset {opset} is not supported: tf2onnx 1.17 writes opsets {MIN_OPSET} to {MAX_OPSET}",
            hint=f"use --opset {DEFAULT_OPSET}, or --export savedmodel",
        )


@dataclass(frozen=True)
class SaveOptions:
    out: Path | str  # a folder, or a URL of object storage (s3://bucket/prefix)
    export: ExportOptions = ExportOptions()
    force: bool = False
    # (file name, JSON value) written into the output folder with the report,
    # so they appear with it, whole or not at all (a batch's result key).
    attachments: tuple[tuple[str, Any], ...] = ()
    # The command line that asked for this run, for the report's provenance; None from the Python API.
    command: tuple[str, ...] | None = None
    # Where the written output is recorded as an MLflow run (tracking.py); off by default.
    tracking: TrackingOptions = TrackingOptions()
    # The key the finished folder is signed with (signing.py); unsigned by default.
    signing: SigningOptions = SigningOptions()

    def __post_init__(self) -> None:
        # A URL stays a string (pathlib would collapse "s3://" into "s3:/"); it is checked
        # here, before any work, so that credentials in it or an http(s) output fail at once.
        if isinstance(self.out, str) and is_url(self.out):
            output_url(self.out)
        elif is_url(self.out):  # pathlib already collapsed it, and "s3:/b/x" must not become a local folder
            raise MpconvertError(
                f"out {self.out} looks like a URL that went through pathlib (which turns // into /)",
                hint="pass an object-storage output as a string, e.g. 's3://bucket/prefix'",
            )
        else:
            object.__setattr__(self, "out", Path(self.out))


def default_out_dir(model_path: Path, policy: str) -> Path:
    """A sibling of the model named after it and the policy.

    For a symlink that is beside the link and after the link's name: the
    user named the link, and its target may sit in a read-only store.
    """
    model_path = Path(model_path)
    stem = model_path.name if model_path.is_dir() else model_path.stem
    return model_path.absolute().parent / f"{stem}_{policy}"


EXPORT_KEYWORDS: dict[str, Keyword] = table(ExportOptions)
