"""The values a conversion works on: the rows from each source (rows.py) and which key holds each input and
label (keys.py), the untrusting .npz reader (npz.py), a model's inputs and outputs (signature.py), what an
output means and what its labels must look like (tasks.py, tokens.py for sequence outputs), the model file
formats and how a file's is read (formats.py), and what judging a conversion needs (context.py). No
framework is imported here.
"""
