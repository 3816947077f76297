import os
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The kernel probe's per-machine answers go to a folder of this test run, not the user's cache.
os.environ.setdefault("MPCONVERT_CACHE_DIR", tempfile.mkdtemp(prefix="mpconvert-test-cache-"))
# tiny_models lives beside the tests
sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_models"


def console_script() -> str:
    """The installed `mpconvert` command beside this interpreter; the tests need it, so its absence fails them."""
    path = Path(sys.executable).parent / "mpconvert"
    assert path.is_file(), f"the mpconvert console script is not installed beside {sys.executable}"
    return str(path)


def invoke(*args, **kwargs):
    """The command line in-process, every argument as a string.

    An exception that escaped the command (not its SystemExit) is raised
    here, so a test fails on it with its traceback, not on an exit code.
    """
    from click.testing import CliRunner

    from mpconvert.cli import cli

    result = CliRunner().invoke(cli, [str(a) for a in args], **kwargs)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", help="also run the tests marked full (make test-full)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "full: slow end-to-end cases left out of `make test`; `make test-full` runs them"
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--full"):
        return
    skip = pytest.mark.skip(reason="end-to-end case for `make test-full`")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


def schema_problems(path: Path) -> list[str]:
    """What breaks the shipped schema in a report.json or batch.json an mpconvert run wrote."""
    import json

    from mpconvert.report.schema import KNOWN_VERSIONS, problems

    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return []  # a test's deliberately corrupt file, or one being replaced
    if not isinstance(document, dict) or document.get("schema_version") not in KNOWN_VERSIONS:
        return []  # not written by mpconvert: a test's stand-in, or one of an unknown version on purpose
    kind = "batch" if path.name == "batch.json" else "report"
    return [f"{path}: {p}" for p in problems(document, kind)]


def broken_reports(root: Path) -> list[str]:
    found = [p for name in ("report.json", "batch.json") for p in root.rglob(name) if p.is_file()]
    return [line for path in found for line in schema_problems(path)]


@pytest.fixture(autouse=True)
def reports_follow_the_schema(request):
    """Every report.json and batch.json a test leaves in its tmp_path must validate against the shipped schema."""
    yield
    root = request.node.funcargs.get("tmp_path")
    broken = broken_reports(root) if root is not None else []
    if broken:
        pytest.fail("reports that break the shipped schema:\n" + "\n".join(broken[:20]), pytrace=False)


def pytest_sessionfinish(session, exitstatus):
    """The reports module-scoped fixtures wrote (under tmp_path_factory) are checked once, at the end."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    broken = broken_reports(factory.getbasetemp())
    if broken:
        print("\nreports that break the shipped schema:\n" + "\n".join(broken[:20]))
        session.exitstatus = 1


@pytest.fixture
def broken_kernel(tmp_path, monkeypatch):
    """A 16-bit kernel broken while oneDNN's rewrites are on (tests/broken_kernels.py), on any machine.

    The one seam for it: the kernel probe's cache and a custom layer that
    hangs, both read where the product reads them, in whichever process
    (the probe and the doctor's timing child are children of the command).
    `env` carries them to the commands a test runs; this process gets them too.
    """
    from broken_kernels import BrokenKernel

    from mpconvert.speed.kernel_probe import CACHE_ENV

    cache = tmp_path / "kernel-probe-cache"
    here = str(Path(__file__).parent)  # where `--import broken_kernels` finds the layer, in any child
    env = {CACHE_ENV: str(cache), "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return BrokenKernel(cache, env)


def refused(result, out, *needles: str) -> str:
    """Exit 1 with one error and one fix line holding the needles, and nothing written."""
    err = result.stderr
    assert result.exit_code == 1, result.output
    assert err.count("error: ") == 1 and err.count("  fix: ") == 1, err
    assert "conversion failed unexpectedly" not in err, err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"
    assert not out.exists()
    return err
