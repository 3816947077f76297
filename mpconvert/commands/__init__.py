"""Whole commands beside the conversion: `mpconvert verify` (verify.py), `mpconvert doctor` (doctor.py) and
`doctor MODEL` (doctor_model.py), and the inputs `mpconvert replay` converts with, checked (replay.py).
"""
