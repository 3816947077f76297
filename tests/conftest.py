import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# tiny_models lives beside the tests
sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_models"
