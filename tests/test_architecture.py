"""The design holds: one place opens ONNX Runtime sessions, no kind switch outside the kinds, skipped stages said.

The layer contracts themselves are import-linter's (`make lint`); these are
the rules a contract cannot express.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import graph_models
import keras
import numpy as np
import pytest
import tiny_models

import mpconvert
from mpconvert.graph.kind import GraphKind
from mpconvert.keras.kind import KerasKind
from mpconvert.kinds import Capability, Unavailable, open_model
from mpconvert.options.convert import LoadOptions

PACKAGE = Path(mpconvert.__file__).parent


def sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def code_of(text: str) -> str:
    """The module without its docstrings and comments: what runs."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                body[0].value.value = ""
    return ast.unparse(tree)


def test_only_the_onnx_runner_opens_onnx_runtime_sessions():
    opening = sorted(name for name, text in sources().items() if "InferenceSession(" in code_of(text))
    assert opening == ["runners/onnx.py"]


def test_a_written_artifact_is_opened_only_by_its_format_in_the_registry():
    # The runners of files on disk; export/formats/ opens artifacts with them for the export's check, verify and
    # --bench-onnx. The doctor runs its own benchmark graphs (no artifacts) through the ONNX runner.
    opening = re.compile(r"\b(SavedModelRunner|OnnxRunner|LiteRTRunner|OpenVinoRunner)\(")
    found = {
        name: sorted(set(opening.findall(code_of(text))))
        for name, text in sources().items()
        if not name.startswith("runners/") and opening.search(code_of(text))
    }
    assert found == {
        "export/formats/savedmodel.py": ["SavedModelRunner"],
        "export/formats/onnx.py": ["OnnxRunner"],
        "export/formats/litert.py": ["LiteRTRunner"],
        "export/formats/openvino.py": ["OpenVinoRunner"],
        "commands/doctor.py": ["OnnxRunner"],
    }


def test_no_kind_switch_outside_the_kinds():
    # What tells the two kinds apart: the frozen graph's class, the graph format, and its name as a string
    # (compared, or a key of a table: a switch written as data).
    switch = re.compile(
        r"\bFrozenGraph\b|\bGraphKind\b|\bKerasKind\b|ModelFormat\.GRAPH|== ['\"]graph['\"]|['\"]graph['\"]\s*:"
    )
    # The kinds (the interface and its choice, the Keras kind, the graph kind) and the model formats.
    allowed = ("kinds/", "keras/", "graph/", "data/formats.py", "runners/graph.py")
    found = {
        name: sorted(set(switch.findall(code_of(text))))
        for name, text in sources().items()
        if not name.startswith(allowed) and switch.search(code_of(text))
    }
    # keras/load.detect_format reads a file's format: inside the kinds, where every switch is.
    assert found == {}


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    """A Keras model and a plain SavedModel's graph, each opened as the pipeline opens it."""
    graph = graph_models.two_matmuls(tmp_path_factory.mktemp("graph") / "mlp")
    return open_model(LoadOptions(tiny_models.mlp(keras))), open_model(LoadOptions(graph))


def test_every_kind_implements_the_whole_interface_and_says_why_it_lacks_a_stage(kinds):
    for kind in (KerasKind, GraphKind):
        assert not getattr(kind, "__abstractmethods__", None), kind
    keras_kind, graph_kind = kinds
    assert isinstance(keras_kind, KerasKind) and isinstance(graph_kind, GraphKind)
    # A Keras model can do every stage: each capability is an object with the stage's method.
    assert keras_kind.lacking() == {}
    assert callable(keras_kind.finetuner().finetune)
    assert callable(keras_kind.padder().pad) and callable(keras_kind.padder().plan)
    assert callable(keras_kind.activation_memory_meter().measure)
    assert callable(keras_kind.inspector().plan)
    # A graph has no Keras layers: it lacks each of them, and says why (the reason the report's `skipped` gives).
    lacking = graph_kind.lacking()
    assert set(lacking) == set(Capability)
    assert all("Keras" in reason for reason in lacking.values()), lacking
    answers = (graph_kind.finetuner(), graph_kind.padder(), graph_kind.activation_memory_meter())
    assert all(isinstance(answer, Unavailable) for answer in (*answers, graph_kind.inspector()))


def test_the_model_interface_names_no_keras_type():
    # kinds/base.py is what every kind implements: the Keras kind's own types stay in keras/.
    tree = ast.parse((PACKAGE / "kinds" / "base.py").read_text())
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert [m for m in imported if m and m.startswith(("mpconvert.keras", "mpconvert.graph", "keras"))] == []


def test_a_keras_conversion_skips_nothing_and_measures_activation_memory():
    keras.utils.set_random_seed(0)
    model = tiny_models.mlp(keras)
    x = np.random.default_rng(0).standard_normal((64, 8)).astype("float32")
    conversion = mpconvert.convert(model, "mixed_float16", data=(x, x[:, :3].argmax(1)), finetune_steps=0)
    report = conversion.report
    assert "skipped" not in report
    assert report["speed"]["memory"]["float32_bytes"] > report["speed"]["memory"]["converted_bytes"] > 0
    assert list(report["speed"]["paths"]) == ["keras", "savedmodel"]


def test_no_submodule_shadows_a_name_of_the_python_api():
    # Importing mpconvert.X sets the package's attribute X: a module named like an API function
    # (mpconvert/check.py and mpconvert.check) would replace that function for every caller.
    modules = {p.stem for p in PACKAGE.glob("*.py")} | {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert modules & set(mpconvert.__all__) == set()
