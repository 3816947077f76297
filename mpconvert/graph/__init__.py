"""The graph kind: a SavedModel without Keras metadata (no keras_metadata.pb), converted at graph level, whose
units are its compute nodes (kind.py, the `ModelKind`).

freeze.py freezes the serving signature into a `FrozenGraph` and saves one back as a SavedModel;
rewrite.py rewrites it to a 16-bit policy node by node, with a Cast on every edge whose ends differ;
search.py ranks nodes for the accuracy-driven search. One name, "graph", for this kind everywhere.
"""
