import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
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
    import pytest

    skip = pytest.mark.skip(reason="end-to-end case for `make test-full`")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)
