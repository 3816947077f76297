"""The report and its gate: what a conversion found, as typed values, and the one verdict on it.

report.py (the `Report`, its JSON form and exit code), sections/ (every part of report.json as a frozen
value that reads any earlier version back), gate.py (every check, collected, then one verdict), checks.py
(a check and the check names), parity.py (an artifact against the converted model, judged again by
verify), measure.py (the converted model against the float32 original on the data), compare.py (the one
comparator of two runs' outputs), consistency.py (what a report read back contradicts), read.py (an
earlier report.json read back), golden.py (golden.npz), diff.py (what a replay changed), schema.py and
schemas/ (the JSON Schemas). No framework is imported here: `mpconvert check` judges a report without
TensorFlow.
"""
