"""One way to run any model: the runner layer.

Every stage that runs a model (validation, artifact parity, the speed stage,
the slow-kernel probe, `mpconvert doctor`) goes through a `Runner`, one per
runtime, so a new runtime (a GPU provider, a LiteRT interpreter, a check on
the serving machine) is one more class here, not a sixth way to run a model.

* `keras`: a Keras model in memory (predict, eager calls, traced calls).
* `graphdef`: a frozen GraphDef in memory (a plain SavedModel's signature).
* `savedmodel`: a written SavedModel's serving signature.
* `onnx`: an ONNX file on ONNX Runtime; the one module that opens its
  sessions and chooses providers. It imports no TensorFlow.

Import the submodules directly; this package imports none of them, so that
running an ONNX file does not pull in TensorFlow.
"""
