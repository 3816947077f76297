"""Where 16 bits break, and what to keep float32 for it: the kind-free search engine (search.py).

Each kind lints its own units and ranks them (keras/lint.py and keras/search.py for layers, graph/kind.py
and graph/search.py for nodes); the grow-and-prune search for the fewest units to keep float32 so the
gate's checks pass, the reason a unit was kept, and what passing means are the same for both, here.
"""
