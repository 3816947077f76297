"""The Keras kind: a Keras 3 or tf-keras model, whose units are layers (kind.py, the `ModelKind`).

load.py reads a model file without running code from it; frameworks.py is what differs between Keras 3
and tf-keras; configs.py is the one reader and editor of Keras configs; trace.py records every layer call;
rewrite.py plans each layer's policy and rebuilds the model, proven faithful by fidelity.py, with
state.py copying the original's state; lint.py, search.py and autokeep.py keep float32 where 16 bits
break; finetune.py fine-tunes with loss scaling; activation_memory.py and pad/ (Tensor-Core padding with
its proof) are the kind's other capabilities.
"""
