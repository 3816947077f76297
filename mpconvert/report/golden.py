"""golden.npz: a few input rows with the float32 model's and the converted model's outputs on them.

Written beside the artifacts, hashed in the report, so that the serving
machine can re-run any artifact on exactly these rows and compare with what
the converted model gave where it was converted (parity) and with what the
float32 model gave (drift), without the data file or the original model.

Keys: `input.<name>` per input, `float32.<name>` and `converted.<name>` per
output, names as the report's `source` lists them. Plain arrays only, so
the file loads with allow_pickle=False.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mpconvert.data.npz import open_npz
from mpconvert.data.signature import Signature
from mpconvert.system.errors import MpconvertError
from mpconvert.system.writing import writing

GOLDEN_NAME = "golden.npz"
GOLDEN_ROWS = 32


@dataclass(frozen=True)
class GoldenRows:
    inputs: list[np.ndarray]
    float32: list[np.ndarray]
    converted: list[np.ndarray]

    @property
    def rows(self) -> int:
        return len(self.inputs[0]) if self.inputs else 0


def _plain(x: np.ndarray) -> np.ndarray:
    # Strings come from the frameworks as object arrays of bytes; as unicode
    # they need no pickle to load.
    x = np.asarray(x)
    if x.dtype == object:
        return np.array([v.decode() if isinstance(v, bytes) else str(v) for v in x.ravel()]).reshape(x.shape)
    return x


def write_golden(path: Path, signature: Signature, golden: GoldenRows) -> Path:
    arrays = {f"input.{s.name}": _plain(x) for s, x in zip(signature.inputs, golden.inputs)}
    for prefix, outputs in (("float32", golden.float32), ("converted", golden.converted)):
        arrays.update({f"{prefix}.{s.name}": _plain(y) for s, y in zip(signature.outputs, outputs)})
    with writing(path, "the golden rows"), open(path, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]  # the stubs read **arrays as allow_pickle
    return path


def read_golden(path: Path, inputs: Sequence[str], outputs: Sequence[str]) -> GoldenRows:
    """The rows and outputs of a golden.npz, for a model with these input and output names."""
    with open_npz(path) as found:
        wanted = [f"input.{n}" for n in inputs] + [f"{p}.{n}" for p in ("float32", "converted") for n in outputs]
        missing = [k for k in wanted if k not in found]
        if missing:
            raise MpconvertError(
                f"{path} lacks {', '.join(missing)}: it is not the golden.npz of this report",
                hint="copy the whole output folder the conversion wrote",
            )
        return GoldenRows(
            [found[f"input.{n}"] for n in inputs],
            [found[f"float32.{n}"] for n in outputs],
            [found[f"converted.{n}"] for n in outputs],
        )
