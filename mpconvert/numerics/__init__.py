"""Where 16 bits break, and what to keep float32 for it.

lint.py: the numeric lint on the float32 model (overflow, information loss,
precision-sensitive configs), before converting; search.py: the
accuracy-driven search for the layers whose float32 fixes a failing check;
autokeep.py: how `auto_keep` applies them around the first validation.
Both run the float32 model with every layer's output recorded through
trace.py, the one reader of Keras node objects (shared with the fidelity
proof and the speed stage, so it stays beside them).
"""
