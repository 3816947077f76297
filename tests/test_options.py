"""Options are declared once: the flags, the API keywords, the manifest keys and the docs come from one table."""

import dataclasses
import inspect as introspect
import json
import re

import keras
import pytest
import tiny_models
from conftest import REPO, invoke
from option_values import changed_values, option_fields, replaced, value_for

import mpconvert
from mpconvert.api import conversion_options, export_options, gate_options
from mpconvert.batch import manifest
from mpconvert.batch.worker import WorkerSpec, job_options, job_spec
from mpconvert.options.convert import CONVERSION_KEYWORDS, ConvertOptions
from mpconvert.options.export import EXPORT_KEYWORDS, ExportOptions
from mpconvert.options.gate import GATE_KEYWORDS
from mpconvert.options.keywords import keywords_of
from mpconvert.render.options_doc import options_markdown

COMMANDS = ("convert", "inspect", "check", "batch", "batch-merge", "doctor", "verify", "sign")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]+)")


def help_flags(command: str) -> set[str]:
    result = invoke(command, "--help")
    assert result.exit_code == 0, result.output
    options = result.output.split("Options:", 1)[1]
    # The flag column only: help text mentions other flags ("--max-regression").
    return {f for line in options.splitlines() for f in FLAG.findall(line[:34])}


def documented_text() -> str:
    return "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])


def test_docs_options_is_generated_from_the_declarations():
    assert (REPO / "docs" / "options.md").read_text() == options_markdown(), "run `make docs`"


def test_every_flag_in_any_help_is_documented_and_every_documented_flag_exists():
    in_help = set().union(*(help_flags(c) for c in COMMANDS))
    assert {"--keep-float32", "--min-speedup", "--import", "--no-speed", "--shard", "--json"} <= in_help
    docs = documented_text()
    undocumented = sorted(f for f in in_help if f"`{f}" not in docs and f"{f}`" not in docs)
    assert not undocumented, f"flags in --help but not in README.md or docs/: {undocumented}"
    documented = set(FLAG.findall((REPO / "docs" / "options.md").read_text()))
    assert documented <= in_help | {"--help", "--version"}, sorted(documented - in_help)


def test_each_declared_keyword_is_a_flag_of_the_main_command_and_a_manifest_key():
    main = help_flags("convert")
    for name, spec in {**CONVERSION_KEYWORDS, **EXPORT_KEYWORDS}.items():
        assert (spec.cli_flag in main) == spec.on_command_line, name
        assert name in manifest.OPTION_KEYS, name
    check = help_flags("check")
    assert {s.cli_flag for s in GATE_KEYWORDS.values()} <= check
    assert "--data" not in check  # check re-judges a report; it takes only thresholds


def test_signatures_list_the_declared_keywords_with_their_defaults():
    params = introspect.signature(conversion_options).parameters
    assert list(params)[:2] == ["model", "policy"]
    assert set(params) - {"model", "policy"} == set(CONVERSION_KEYWORDS)
    assert params["pad_multiple"].default == 8 and params["auto_keep"].default == "search"
    assert set(introspect.signature(gate_options).parameters) == set(GATE_KEYWORDS)


def test_one_keyword_fills_every_field_that_declares_it():
    options = conversion_options("m.keras", "mixed_float16", seed=7, finetune_steps=3, pad_multiple=16, atol=0.5)
    assert options.seed == 7
    assert options.finetune.steps == 3 and options.pad.multiple == 16
    assert options.gate.atol == ((None, 0.5),)
    assert options.load.source == "m.keras" and options.rewrite.policy == "mixed_float16"
    assert export_options(export="savedmodel").kinds == ("savedmodel",)
    assert export_options(export=["onnx"], opset=13).opset == 13


def test_a_keyword_is_declared_by_one_field_only():
    from dataclasses import dataclass

    from mpconvert.options.keywords import keyword, table

    @dataclass(frozen=True)
    class First:
        seed: int = keyword(0, kind="int", help="a seed")

    @dataclass(frozen=True)
    class Second:
        seed: int = keyword(0, kind="int", help="the same seed again")

    with pytest.raises(ValueError, match="'seed' is declared by"):
        table(First, Second)
    assert CONVERSION_KEYWORDS["seed"].target == (ConvertOptions, "seed")


def spelled_by_keywords(option) -> bool:
    """A field a keyword sets, or one of conversion_options' own arguments (the model, the policy)."""
    return option.has_keyword or option.field.default is dataclasses.MISSING


def test_the_keywords_of_any_options_build_them_again(tmp_path):
    values = changed_values(tmp_path / "other.keras", tmp_path / "other.npz", tmp_path / "other.json")
    options, export = conversion_options(tmp_path / "m.keras", "mixed_float16"), export_options()
    for root in (ConvertOptions, ExportOptions):
        for option in filter(spelled_by_keywords, option_fields(root)):
            value = value_for(values, option)
            assert value != option.field.default, option.name
            if root is ConvertOptions:
                options = replaced(options, option.path, value)
            else:
                export = replaced(export, option.path, value)
    assert conversion_options(options.load.source, options.rewrite.policy, **keywords_of(options)) == options
    assert export_options(**keywords_of(export)) == export
    # A batch worker gets them through JSON: all but custom_objects, which a manifest refuses.
    job = manifest.Job("m", replaced(options, ("load", "custom_objects"), None), export)
    assert job_options(WorkerSpec.from_json(json.loads(json.dumps(job_spec(job).to_json())))) == (
        job.options,
        job.export,
    )


def test_keywords_of_refuses_a_field_that_no_keyword_sets(tmp_path):
    values = changed_values(tmp_path / "other.keras", tmp_path / "other.npz", tmp_path / "other.json")
    base = {ConvertOptions: conversion_options(tmp_path / "m.keras", "mixed_float16"), ExportOptions: export_options()}
    unspelled = [(root, o) for root in base for o in option_fields(root) if not spelled_by_keywords(o)]
    assert unspelled, "no field without a keyword left: this test has nothing to check"
    for root, option in unspelled:
        with pytest.raises(ValueError, match=rf"{option.name}=.* has no keyword"):
            keywords_of(replaced(base[root], option.path, value_for(values, option)))


@pytest.mark.parametrize(
    "call,needle",
    [
        (lambda: mpconvert.convert("m.keras", "mixed_float16", pad_multiples=8), "did you mean 'pad_multiple'"),
        (lambda: mpconvert.check({}, max_drops=0.1), "did you mean 'max_drop'"),
        (lambda: export_options(opsets=17), "did you mean 'opset'"),
    ],
)
def test_an_unknown_keyword_names_the_nearest_one(call, needle):
    with pytest.raises(mpconvert.MpconvertError) as caught:
        call()
    assert needle in caught.value.message and caught.value.hint


@pytest.mark.parametrize(
    "flag,keyword,value,rule",
    [
        ("--pad-multiple", "pad_multiple", -8, "an integer >= 0 (0 turns padding off)"),
        ("--learning-rate", "learning_rate", 0, "a number > 0"),
        ("--min-agreement", "min_agreement", 1.5, "between 0 and 1 or None"),
        ("--search-budget", "search_budget", 0, "a number > 0 (seconds)"),
    ],
)
def test_the_cli_and_the_api_refuse_the_same_values(tmp_path, flag, keyword, value, rule):
    path = tmp_path / "m.keras"
    tiny_models.mlp(keras).save(path)
    result = invoke(path, "--policy", "mixed_float16", flag, value, "--out", tmp_path / "o")
    assert result.exit_code == 2 and flag in result.output
    assert not (tmp_path / "o").exists()
    with pytest.raises(mpconvert.MpconvertError) as caught:
        conversion_options(path, "mixed_float16", **{keyword: value})
    assert caught.value.message == f"{keyword}={value!r} is invalid: it must be {rule}"


@pytest.mark.parametrize(
    "flag,text,keywords",
    [
        ("--export", "bogus", {"export": "bogus"}),
        ("--export", ",", {"export": ","}),
        ("--atol", "tflite=1", {"atol": {"tflite": 1}}),
        ("--rtol", "-1", {"rtol": -1}),
        ("--atol", "inf", {"atol": float("inf")}),
        ("--rtol", "nan", {"rtol": float("nan")}),
    ],
)
def test_export_kinds_and_tolerances_are_refused_in_the_same_words_by_the_cli_and_the_api(
    tmp_path, flag, text, keywords
):
    with pytest.raises(mpconvert.MpconvertError) as caught:
        if "export" in keywords:
            export_options(**keywords)
        else:
            gate_options(**keywords)
    result = invoke(tmp_path / "m.keras", "--policy", "mixed_float16", flag, text, "--out", tmp_path / "o")
    assert result.exit_code == 2 and flag in result.output
    assert caught.value.message in " ".join(result.output.split())


def test_the_manifest_takes_each_key_with_its_declared_toml_type(tmp_path):
    model = tmp_path / "m.keras"
    tiny_models.mlp(keras).save(model)
    (tmp_path / "batch.toml").write_text(
        '[defaults]\npolicy = "mixed_float16"\npad_multiple = "8"\nspeed = 1\nbench_onnx = true\n'
        'export = "savedmodel"\nkeep_float32 = "dense"\n[[model]]\npath = "m.keras"\n'
    )
    with pytest.raises(mpconvert.MpconvertError) as caught:
        manifest.load_manifest(tmp_path / "batch.toml")
    assert "pad_multiple = '8' must be a number" in caught.value.message
    assert "speed = 1 must be true/false" in caught.value.message
    (tmp_path / "batch.toml").write_text(
        '[defaults]\npolicy = "mixed_float16"\npad_multiple = 16\nbench_onnx = true\n'
        'export = "savedmodel"\nkeep_float32 = "dense"\n[[model]]\npath = "m.keras"\n'
    )
    (job,) = manifest.load_manifest(tmp_path / "batch.toml")
    assert job.export.kinds == ("savedmodel",) and job.export.bench_onnx is True
    assert job.options.pad.multiple == 16 and job.options.rewrite.keep_float32 == ("dense",)


def test_doctor_budget_defaults_to_the_timing_constant():
    from mpconvert.cli.doctor import doctor_command
    from mpconvert.options.convert import DEFAULT_DOCTOR_BUDGET_S as DEFAULT_BUDGET_S

    (budget,) = [p for p in doctor_command.params if p.name == "budget"]
    assert budget.default == DEFAULT_BUDGET_S


def test_batch_flags_are_derived_from_the_batch_options_declarations():
    from mpconvert.cli.batch import batch_command
    from mpconvert.options.batch import BATCH_KEYWORDS, BatchOptions

    assert set(BATCH_KEYWORDS) == {"baseline", "max_regression", "executor", "ray_address"}
    params = {p.name: p for p in batch_command.params}
    for name, spec in BATCH_KEYWORDS.items():
        assert params[name].opts == [spec.cli_flag], name
        assert spec.help in params[name].help, name
        assert spec.default is None or params[name].default == spec.default, name
    # The declared range holds for the Python API too, and the flag refuses the same values.
    with pytest.raises(mpconvert.MpconvertError, match="max_regression=-1 is invalid"):
        BatchOptions("root", max_regression=-1)
    result = invoke("batch", "zoo.toml", "--out", "root", "--max-regression", "-1")
    assert result.exit_code == 2 and "--max-regression" in result.output
