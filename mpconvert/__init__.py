"""mpconvert: convert float32 Keras models to mixed precision, check the accuracy change, export.

    import mpconvert
    conv = mpconvert.convert(model, "mixed_bfloat16", data=(x_val, y_val))
    conv.model.predict(x)              # the converted model, in memory
    conv.passed, conv.report           # the gate's verdict and the full report
    conv.save("out/")                  # SavedModel + ONNX, re-loaded and checked

Importing this package does not import TensorFlow; converting does.
"""

import logging as _logging

from mpconvert.api import Conversion, Inspection, Replay, check, convert, inspect, replay, sign, verify
from mpconvert.options.precision import POLICIES, Precision
from mpconvert.report.report import mpconvert_version as _mpconvert_version
from mpconvert.system.errors import MpconvertError

# A library logs, the application decides what to show: without this, Python's
# last-resort handler would print mpconvert's warnings from convert().
_logging.getLogger("mpconvert").addHandler(_logging.NullHandler())

__version__ = _mpconvert_version()

__all__ = [
    "Conversion",
    "Inspection",
    "MpconvertError",
    "POLICIES",
    "Precision",
    "Replay",
    "check",
    "convert",
    "inspect",
    "replay",
    "sign",
    "verify",
    "__version__",
]
