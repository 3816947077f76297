"""ONNX export and running, one module per job.

* `export`: converting Keras models with tf2onnx (the only module that
  imports tf2onnx, and TensorFlow at import time), with the patches and
  checks that mixed-precision models need.
* `repairs`: passes that fix what tf2onnx gets wrong in 16-bit graphs.
* `graph`: ModelProto helpers the repairs and the runner share.
* `run`: running an ONNX file on ONNX Runtime (or onnx.reference), without
  TensorFlow.

Import from the submodules directly; this package imports none of them, so
that running an ONNX file does not pull in TensorFlow.
"""
