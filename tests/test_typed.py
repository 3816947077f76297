"""The typed values behind every JSON file mpconvert writes keep each file's keys exactly, and read back as themselves.

No model runs here: hand-made reports (reports.py), batch entries and
verifications, checked key for key against the layouts the files have
always had (the schemas validate the rest).
"""

import json
from dataclasses import replace
from types import SimpleNamespace

from reports import make_report, thresholds, typed

from mpconvert.batch.results import BatchSummary, Status, entry, failed_entry, finish, merge
from mpconvert.batch.worker import WorkerResult, WorkerSpec
from mpconvert.options.gate import Baseline
from mpconvert.options.tracking import TrackingOptions
from mpconvert.report.checks import Check, ParityValues
from mpconvert.report.gate import evaluate
from mpconvert.report.schema import problems
from mpconvert.report.sections import ActivationMemory, Gpu, Hardware
from mpconvert.report.sections.speed import Latency
from mpconvert.report.verification import (
    ArtifactRun,
    BatchVerification,
    ConversionVerdict,
    Drift,
    FileCheck,
    Machines,
    MemoryGrowth,
    ModelVerification,
    Provider,
    VerifyReport,
    VersionChange,
)

SHA = "ab" * 32


def values_of(report: dict, th=None) -> dict[str, dict]:
    th = th or thresholds()
    return {c.name: c.to_json()["values"] for c in evaluate(typed(report, th), th).checks}


def test_each_kind_of_check_writes_the_keys_it_always_wrote_in_their_order():
    labelled = make_report(
        validation={"agreed": 490, "agreement_rows": 500, "harmed": 3, "fixed": 8, "kept_correct_rows": 440}
    )
    # The kept-correct share is derived: 437 of the 440 rows the float32 model got right.
    found = values_of(replace_kept(labelled, 437 / 440))
    assert list(found["agreement"]) == ["kept_correct", "min_agreement", "rows", "harmed", "fixed", "agreement"]
    assert found["agreement"]["rows"] == 440 and found["agreement"]["harmed"] == 3
    # Too few right to judge one harmed row: the counts, and nothing judged.
    few = values_of(replace_kept(make_report(validation={**few_right(), "harmed": 1}), 4 / 5))
    assert few["agreement"] == {"kept_correct": None, "rows": 0, "harmed": 1, "fixed": 8}
    none_right = values_of(make_report(validation={**few_right(), "harmed": 0, "kept_correct_rows": 0}))
    assert none_right["agreement"] == {"kept_correct": None, "rows": 0, "fixed": 8}
    ties = values_of(make_report(validation={"agreement_rows": 0, "agreed": 0}))
    assert ties["agreement"] == {"agreement": None, "rows": 0}
    # NaN/inf outputs name where they were; a clean run has no such key.
    assert "nonfinite_by_output" not in values_of(make_report())["accuracy gate"]
    dirty = values_of(make_report(validation={"nonfinite_outputs": 7}))["accuracy gate"]
    assert list(dirty)[-2:] == ["nonfinite_outputs", "nonfinite_by_output"] and dirty["nonfinite_outputs"] == 7
    # An unmeasured speed has only its threshold and no ratio.
    assert values_of(make_report(), thresholds(min_speedup=1.5))["speed"] == {"min_speedup": 1.5, "ratio": None}
    # A comparable baseline adds the regression; another metric leaves it out.
    old = Baseline("prev/report.json", "accuracy", 0.96, "mixed_float16", "net")
    judged = values_of(make_report(), thresholds(baseline=old))["baseline regression"]
    assert list(judged) == ["metric", "converted", "baseline", "max_regression", "baseline_path", "regression"]
    assert abs(judged["regression"] - (0.96 - 0.948)) < 1e-12
    other = values_of(make_report(), thresholds(baseline=replace(old, metric="mse")))["baseline regression"]
    assert "regression" not in other and other["metric"] == "accuracy"
    parity = values_of(make_report())["artifact parity: onnx"]
    assert list(parity) == ["max_abs_diff", "max_abs_ref", "atol", "rtol", "limit", "rows"]
    assert abs(parity["limit"] - (0.001 + 0.0015 * 2.0)) < 1e-12


def few_right() -> dict:
    return {"agreed": 490, "agreement_rows": 500, "fixed": 8, "kept_correct_rows": 5}


def replace_kept(report: dict, kept: float) -> dict:
    report["validation"]["kept_correct"] = kept
    return report


def test_a_check_without_figures_of_its_own_writes_empty_values():
    assert Check("hash: model.onnx", True, "as written").to_json() == {
        "name": "hash: model.onnx",
        "passed": True,
        "message": "as written",
        "values": {},
    }


def test_the_machine_and_the_activation_memory_read_back_as_written():
    machine = Hardware("AMD EPYC", ("avx512f", "avx512_bf16"), (Gpu("A100", (8, 0)), Gpu("old", None)), 0)
    stored = machine.to_json()
    assert stored["device"] == "GPU: A100" and stored["cpu_features"]["avx512_bf16"] is True
    assert stored["gpus"][0] == {
        "name": "A100",
        "compute_capability": "8.0",
        "float16_tensor_cores": True,
        "bfloat16_tensor_cores": True,
    }
    assert Hardware.from_json(json.loads(json.dumps(stored))) == machine
    memory = ActivationMemory.of(256, 2000, 1000, "computed from layer output shapes and dtypes")
    assert memory.ratio == 0.5 and ActivationMemory.from_json(memory.to_json()) == memory
    # A ratio that contradicts its byte counts is derived again.
    assert replace(memory, ratio=0.9).derived().ratio == 0.5


class Job(SimpleNamespace):
    pass


def job(name: str, policy: str = "mixed_float16") -> Job:
    return Job(name=name, given_path=f"{name}.keras", policy=policy, folder=f"{name}/{policy}")


OPTIONS = SimpleNamespace(shard=None, shard_source=None, executor="local", max_regression=0.0)


def test_a_batch_summary_reads_back_as_itself_and_a_regression_against_the_last_fails_it():
    report = typed(make_report(validation={"drop": 0.0, "converted": 0.962}), thresholds())
    first = finish("/zoo", [entry(job("net"), "k1", report, Status.PASSED, "", 1.5)], 60.0, OPTIONS, 2, None, True)
    stored = json.loads(json.dumps(first.to_json()))
    assert problems(stored, "batch") == []
    assert BatchSummary.from_json(stored) == first
    assert list(stored) == [
        "schema_version",
        "root",
        "shard",
        "shard_source",
        "finished",
        "jobs",
        "executor",
        "models",
        "totals",
        "exit_code",
        "passed",
    ]
    (item,) = stored["models"]
    assert (item["after"], item["onnx_bytes"], item["kept_float32_share"]) == (0.962, 1024, 0.3333)
    # The same model, worse by 0.014 than the batch before it: a gate failure with the numbers.
    worse = typed(make_report(), thresholds())
    again = finish("/zoo", [entry(job("net"), "k2", worse, Status.PASSED, "", 1.0)], 1.0, OPTIONS, 1, first, True)
    (judged,) = again.models
    assert judged.status == Status.GATE_FAILED and judged.failed_checks[-1] == "baseline regression"
    assert judged.baseline is not None and judged.baseline.to_json() == {"after": 0.962, "regression": 0.014}
    assert again.exit_code == 3 and "0.9480 vs 0.9620 before" in judged.message


def test_merged_shards_of_separate_roots_keep_each_model_s_root_and_list_the_shards():
    one = finish("/a", [failed_entry(job("x"), "k", Status.ERROR, "broken", 2.0)], 10.0, OPTIONS, 1, None, True)
    two = finish("/b", [failed_entry(job("y"), "k", Status.TIMED_OUT, "slow", 9.0)], 30.0, OPTIONS, 1, None, True)
    merged = merge([one, two]).to_json()
    assert "executor" not in merged and merged["shards"] == ["/a", "/b"] and merged["root"] is None
    assert [m["root"] for m in merged["models"]] == ["/a", "/b"]
    assert merged["totals"]["elapsed_seconds"] == 30.0 and merged["exit_code"] == 1
    assert problems(merged, "batch") == []


def test_a_worker_spec_and_its_result_survive_their_json():
    spec = WorkerSpec(
        model="/m/net.keras",
        given_path="net.keras",
        policy="mixed_bfloat16",
        options={"data": "/d.npz", "keep_float32": ["head"], "finetune_steps": 0},
        export={"export": ["savedmodel"]},
        out="/out/net",
        key="k",
        parent=123,
        result="/w/net.result.json",
        command=("mpconvert", "batch", "zoo.toml"),
        tracking=TrackingOptions(uri="http://127.0.0.1:5000", parent_run="p"),
    )
    assert WorkerSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert "cwd" not in spec.to_json() and replace(spec, cwd="/here").to_json()["cwd"] == "/here"
    # The signing key travels by path; its password is not a field at all (the worker's environment holds it).
    signed = replace(spec, sign_key="/keys/ci.pem")
    assert WorkerSpec.from_json(json.loads(json.dumps(signed.to_json()))) == signed
    assert "sign_key" not in spec.to_json() and "password" not in json.dumps(signed.to_json())
    result = WorkerResult(Status.GATE_FAILED, "failed: accuracy gate", 3.5)
    assert result.to_json() == {"status": "gate_failed", "message": "failed: accuracy gate", "seconds": 3.5}
    assert WorkerResult.from_json(result.to_json()) == result


def verification(tampered: bool) -> VerifyReport:
    parity = Check(
        "artifact parity: onnx",
        True,
        "max abs diff 0.0002 <= limit 0.02",
        ParityValues(2e-4, 1.0, 1e-5, 0.02, 0.02001, 8),
    )
    run = ArtifactRun(
        "onnx",
        "model.onnx",
        runtime="onnxruntime:CPUExecutionProvider",
        parity=parity,
        drift={"probs": Drift(0.003, 0.0029)},
        latency=Latency.of([1.0, 2.0, 3.0], 8),
        memory=MemoryGrowth(4096, "peak resident memory"),
    )
    return VerifyReport(
        folder="/out/net",
        model="net",
        policy="mixed_float16",
        files=(FileCheck("model.onnx", "onnx", SHA, "cd" * 32 if tampered else SHA),),
        artifacts=(run,),
        conversion=ConversionVerdict(True, ()),
        provider=Provider("auto", ("CPUExecutionProvider",)),
        speed_batch=8,
        golden_rows=16,
        chosen=("savedmodel", "onnx"),
        versions={"onnxruntime": VersionChange("1.30.0", "1.31.0")},
        machine=Machines(None, Hardware("cpu", ())),
    )


def test_a_verification_writes_verify_json_s_layout_with_a_line_per_check():
    good, bad = verification(False), verification(True)
    stored = json.loads(json.dumps(good.to_json(), allow_nan=False))
    assert problems(stored, "verify") == []
    assert [c["name"] for c in stored["checks"]] == ["hash: model.onnx", "runs: onnx", "conversion gate"]
    assert set(stored["checks"][0]) == {"name", "passed", "message"}
    onnx = stored["artifacts"][0]
    assert onnx["parity"] == {"passed": True, "message": parity_message(), "values": onnx["parity"]["values"]}
    assert onnx["parity"]["values"]["limit"] == 0.02001 and onnx["drift"] == {
        "probs": {"here": 0.003, "converted": 0.0029}
    }
    assert onnx["latency"]["p50_ms"] == 2.0 and onnx["memory"]["rss_growth_bytes"] == 4096
    assert stored["versions"] == {"onnxruntime": {"converted": "1.30.0", "here": "1.31.0"}}
    assert good.exit_code == 0 and bad.exit_code == 3 and "has changed" in bad.checks[0].message
    root = BatchVerification(
        "/zoo",
        (
            ModelVerification("net", "mixed_float16", "net/mixed_float16", False, "failed: hash: model.onnx", bad),
            ModelVerification("x", "mixed_float16", "x/mixed_float16", False, "not converted (error)"),
        ),
    )
    document = json.loads(json.dumps(root.to_json()))
    assert problems(document, "verify") == [] and document["exit_code"] == 3
    assert "verification" in document["models"][0] and "verification" not in document["models"][1]
    assert root.verified == (bad,)


def parity_message() -> str:
    return "max abs diff 0.0002 <= limit 0.02"
