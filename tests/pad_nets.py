"""Hand-written layer graphs for the padding planner's tests, in both frameworks' config formats."""

from mpconvert.keras.pad import LayerGraph


class Net:
    """A functional config and its layer shapes, written the way a framework writes them.

    Keras 3 refers to a tensor with a `__keras_tensor__` dict and calls a
    layer with {"args", "kwargs"}; tf-keras uses `[name, node, tensor, {}]`
    lists (see configs.tensor_refs).
    """

    def __init__(self, fmt: str):
        self.fmt = fmt
        self.layers: list[dict] = []
        self.shapes: dict[str, tuple] = {}

    def input(self, name: str, shape: tuple) -> tuple:
        key = "batch_shape" if self.fmt == "keras3" else "batch_input_shape"
        self._add("InputLayer", name, {"dtype": "float32", key: [None, *shape]}, [], None, (None, *shape))
        return (name, 0)

    def __call__(self, class_name: str, name: str, *calls, shape: tuple, **config) -> tuple:
        """`name` called once per entry of `calls`: a (layer, node) tensor or a list of them."""
        nodes = [self._node(call) for call in calls]
        first = calls[0][0] if isinstance(calls[0], list) else calls[0]
        self._add(class_name, name, config, nodes, self.shapes[first[0]][1], (None, *shape))
        return (name, 0)

    def graph(self, *outputs: tuple) -> LayerGraph:
        config = {"name": "m", "layers": self.layers, "output_layers": [[n, i, 0] for n, i in outputs]}
        return LayerGraph.from_config(config, self.shapes)

    def _add(self, class_name, name, config, nodes, in_shape, out_shape):
        self.layers.append(
            {"class_name": class_name, "name": name, "config": {"name": name, **config}, "inbound_nodes": nodes}
        )
        self.shapes.setdefault(name, (in_shape, out_shape))

    def _ref(self, tensor: tuple):
        name, node = tensor
        if self.fmt == "tf_keras":
            return [name, node, 0, {}]
        history = {"shape": list(self.shapes[name][1]), "dtype": "float32", "keras_history": [name, node, 0]}
        return {"class_name": "__keras_tensor__", "config": history}

    def _node(self, call):
        refs = [self._ref(t) for t in call] if isinstance(call, list) else [self._ref(call)]
        if self.fmt == "tf_keras":
            return refs
        return {"args": [refs] if isinstance(call, list) else refs, "kwargs": {}}
