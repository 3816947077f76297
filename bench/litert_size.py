"""LiteRT (.tflite) size with float16 weights against a float32 .tflite of the same model (target 0.5x).

What `--export litert` writes (mpconvert.export.formats.litert.write_litert, from the
model's float32 SavedModel) against the same converter without the float16
weight quantization, both written in this run. Prints the CPU it ran on:
the size does not depend on it, the conversion time does.
"""

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import keras  # noqa: E402
from onnx_size import MODELS  # noqa: E402  (the same models as the ONNX size benchmark)

from mpconvert.export.formats.litert import write_litert  # noqa: E402
from mpconvert.speed import read_cpu  # noqa: E402


def main() -> None:
    cpu, flags = read_cpu()
    print(
        f"LiteRT file size, float16 weights / float32 (target 0.5x); CPU: {cpu} ({', '.join(flags) or 'no 16-bit flags'})"
    )
    print(f"{'model':<14}{'float32':>12}{'float16 weights':>18}{'ratio':>8}{'convert s':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in MODELS.items():
            keras.utils.set_random_seed(0)
            saved = Path(tmp) / name
            build().export(str(saved), verbose=False)
            full = write_litert(saved, Path(tmp) / f"{name}_f32.tflite", float16_weights=False).path.stat().st_size
            start = time.perf_counter()
            half = write_litert(saved, Path(tmp) / f"{name}_f16.tflite").path.stat().st_size
            seconds = time.perf_counter() - start
            print(f"{name:<14}{full / 1e6:>10.2f}MB{half / 1e6:>16.2f}MB{half / full:>8.3f}{seconds:>11.1f}")


if __name__ == "__main__":
    main()
