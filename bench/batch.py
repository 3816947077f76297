"""Batch throughput: one zoo converted with --jobs 1 and with --jobs 2, in one run.

The zoo: the three sample models with their data, MobileNetV2, EfficientNetB0
and ResNet50 (keras.applications, weights=None, 32x32 inputs, no data: drift
only) and one broken file, all under mixed_bfloat16, fine-tuning off. Prints
models per minute for each and the ratio; --jobs 1 is the baseline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_models"
APPLICATIONS = ("MobileNetV2", "EfficientNetB0", "ResNet50")


def build_zoo(folder: Path) -> Path:
    import keras

    for name in APPLICATIONS:
        keras.utils.set_random_seed(0)
        getattr(keras.applications, name)(weights=None, input_shape=(32, 32, 3), classes=10).save(
            folder / f"{name}.keras"
        )
    (folder / "broken.keras").write_bytes(b"truncated download")
    entries = [
        (SAMPLES / "digits_mlp", SAMPLES / "data" / "digits.npz"),
        (SAMPLES / "digits_cnn.keras", SAMPLES / "data" / "digits.npz"),
        (SAMPLES / "cancer_mlp.keras", SAMPLES / "data" / "breast_cancer.npz"),
        *[(folder / f"{name}.keras", None) for name in APPLICATIONS],
        (folder / "broken.keras", None),
    ]
    lines = ['[defaults]\npolicy = "mixed_bfloat16"\nfinetune_steps = 0\n']
    for model, data in entries:
        lines.append(f'[[model]]\npath = "{model}"\n' + (f'data = "{data}"\n' if data else ""))
    manifest = folder / "zoo.toml"
    manifest.write_text("\n".join(lines))
    return manifest


def run(manifest: Path, out: Path, jobs: int) -> tuple[float, dict]:
    script = Path(sys.executable).parent / "mpconvert"
    start = time.perf_counter()
    proc = subprocess.run([str(script), "batch", str(manifest), "--out", str(out), "--jobs", str(jobs), "--quiet"])
    elapsed = time.perf_counter() - start
    summary = json.loads((out / "batch.json").read_text())
    assert proc.returncode == summary["exit_code"] == 1, "the broken model must be the only failure"
    return elapsed, summary


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="mpconvert-bench-batch-"))
    try:
        manifest = build_zoo(folder)
        results = {jobs: run(manifest, folder / f"out{jobs}", jobs) for jobs in (1, 2)}
        print(f"batch: {len(results[1][1]['models'])} model/policy runs (1 broken) on {os.cpu_count()} cores")
        rates = {}
        for jobs, (elapsed, summary) in results.items():
            t = summary["totals"]
            rates[jobs] = t["models_per_minute"]
            print(
                f"  --jobs {jobs}: {elapsed:.1f} s wall, {t['passed']} passed, {t['error']} errors, "
                f"{t['models_per_minute']:.2f} models/min"
            )
        print(f"  --jobs 2 vs --jobs 1: x{rates[2] / rates[1]:.2f} models per minute")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
