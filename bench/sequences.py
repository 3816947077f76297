"""Sequence outputs end to end: the keras-hub GPT-2 with a logits head and with a softmax head, and the
mask_zero token tagger (tests/sequence_models.py), each converted under both policies with the defaults
and a short fine-tune.

Each run is the command line in a fresh process (`mpconvert MODEL --policy P --data D --finetune-steps
STEPS`, `--import keras_hub` for GPT-2). Printed per run: the exit code, the token accuracy of the float32
and the converted model, the fine-tune's before and after, both cross-entropies, the tokens scored and
the padding left out, and the wall time. A few minutes on 2 cores.

    python bench/sequences.py [--steps 20] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

MODELS = (("gpt2_logits", "gpt2.npz"), ("gpt2_softmax", "gpt2.npz"), ("tagger", "tagger.npz"))
POLICIES = ("mixed_float16", "mixed_bfloat16")


def number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def run(folder: Path, model: str, data: str, policy: str, steps: int) -> str:
    out = folder / f"{model}-{policy}"
    command = [str(Path(sys.executable).parent / "mpconvert"), str(folder / f"{model}.keras"), "--policy", policy]
    command += ["--data", str(folder / data), "--out", str(out), "--finetune-steps", str(steps), "--quiet"]
    if model.startswith("gpt2"):
        command += ["--import", "keras_hub"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if not (out / "report.json").exists():
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-2:]
        return f"{model:13} {policy:15} exit {done.returncode}  {seconds:6.1f} s  {' / '.join(last)}"
    report = json.loads((out / "report.json").read_text())
    v, tuning = report["validation"], report.get("finetune") or {}
    tokens = v.get("tokens") or {}
    return (
        f"{model:13} {policy:15} exit {done.returncode}  {seconds:6.1f} s  {v['metric']} "
        f"{number(v['reference'])} -> {number(v['converted'])} (fine-tune {number(tuning.get('metric_before'))} -> "
        f"{number(tuning.get('metric_after'))}, kept {tuning.get('kept')}); cross-entropy "
        f"{number(tokens.get('reference_cross_entropy'))} -> {number(tokens.get('converted_cross_entropy'))}; "
        f"{tokens.get('scored')} tokens, {tokens.get('padding')} padding; "
        f"failed: {', '.join(c['name'] for c in report['gate']['checks'] if not c['passed']) or 'none'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="fine-tuning steps per run")
    parser.add_argument("--keep", type=Path, help="build and convert in this folder, and keep it")
    args = parser.parse_args()
    import keras
    import sequence_models

    with tempfile.TemporaryDirectory(prefix="mpconvert-sequences-") as tmp:
        folder = args.keep or Path(tmp)
        sequence_models.save_all(keras, folder)
        for model, data in MODELS:
            for policy in POLICIES:
                print(run(folder, model, data, policy, args.steps), flush=True)


if __name__ == "__main__":
    main()
