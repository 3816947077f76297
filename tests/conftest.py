import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# tiny_models lives beside the tests
sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_models"


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
