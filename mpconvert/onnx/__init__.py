"""ONNX export and running, one module per job.

* `export`: converting Keras models with tf2onnx (the only module that
  imports tf2onnx, and TensorFlow at import time), with the patches and
  checks that mixed-precision models need.
* `repairs`: passes that fix what tf2onnx gets wrong in 16-bit graphs.
* `proto`: ModelProto helpers the repairs and the runner share.
* `emulate`: a copy of a graph whose 16-bit ops compute in float32, for a
  runtime that lacks 16-bit kernels.
* `checks` and `graphdef`: checks on a converted graph, passes on the
  GraphDef before tf2onnx.

Running an ONNX file is runners/onnx.py's job. Import from the submodules
directly; this package imports none of them, so that checking an ONNX file
does not pull in TensorFlow.
"""
