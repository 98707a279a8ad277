"""Custom Keras layers re-traced into built-in layers and operation nodes.

A Keras 3 layer's `call` run directly on symbolic `KerasTensor`s records what it does as nodes of
a functional graph: its sublayers' calls as layer nodes, its `keras.ops` calls (and `x + y`) as
operation nodes. `flatten` walks a model's graph and re-runs every node: a built-in layer is
called as it was (the same object, so the same weights); a custom layer (or a subclassed model)
has its `call` run on the symbolic tensors instead, recursively, so that what remains is a plain
functional model of built-in classes that `cargo xtask convert` and `predict` read. Values that
`call` computes eagerly while tracing (an `Embedding` of `ops.arange(length)`) become constants
of the graph.

A layer's own weights that `call` reads (a learned position embedding, a class token) become
`Weight` nodes (`keras2torch.weight`), so that they stay weights of the flattened model.

What cannot be traced is named with the reason and left as it was (`convert` then refuses it by
name): raw TensorFlow ops on symbolic tensors (`tf.shape`, `tf.image.extract_patches`), Python
control flow on tensor values, own weights held other than as attributes (they would become
constants), sizes unknown while tracing (give `batch_size` or `--shape NAME=...`).

    python -m keras2torch.flatten MODEL.keras --import LAYERS.py --out FLAT.keras
"""

import argparse
import collections
import importlib.util
import inspect
import json
import os
import re
import sys
import tempfile
import traceback
from dataclasses import dataclass, field

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

try:
    import numpy as np
except ModuleNotFoundError:  # `main` says so in one line (`missing_requirement`)
    np = None


@dataclass
class FlattenReport:
    """What `flatten` did: the custom layers traced and those left, with the reason."""

    traced: list = field(default_factory=list)
    """`(layer name, class name)` of every custom layer (or subclassed model) re-traced."""
    kept: list = field(default_factory=list)
    """`(layer name, class name, reason)` of every custom layer left as it was."""
    difference: float = None
    """The largest difference between the flattened and the original model on random inputs."""
    blocks: dict = None
    """Where each node of the flattened model came from (`_block_record`): saved beside the
    graph as config.json's `keras2torch` entry, from which the torch writer makes one module
    class per traced custom layer."""

    def lines(self):
        out = [f"traced {name} ({cls})" for name, cls in self.traced]
        out += [f"kept {name} ({cls}): {reason}" for name, cls, reason in self.kept]
        if self.difference is not None:
            out.append(f"max |flattened - original| = {self.difference:.3e} on random inputs")
        return out


def is_builtin(layer):
    """A class of Keras' layers itself (its module is `keras.src...`), not the user's, nor one
    that `keras.applications` defines for its own networks (ConvNeXt's `LayerScale` and
    `StochasticDepth`), which is traced like the user's."""
    module = type(layer).__module__
    return module.startswith("keras.") and not module.startswith("keras.src.applications.")


def _user_frame(error):
    """`file:line: code` of the innermost frame outside Keras and TensorFlow, for the reason."""
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        if not any(part in frame.filename for part in ("/keras/", "/tensorflow/", "/tf_keras/", __file__)):
            return f"{os.path.basename(frame.filename)}:{frame.lineno}: {frame.line}"
    return None


class _Tracer:
    """Runs custom layers' `call` on symbolic tensors while a model is re-traced.

    `layer(x)` looks `__call__` up on the class, so each custom class below the model gets a
    `__call__` that traces the instances being flattened and calls Keras as usual otherwise;
    `restore` puts the classes back.
    """

    def __init__(self, report):
        self.report = report
        self.layers = set()
        self.classes = {}
        self.weights = {}  # id(variable) -> the Weight layer standing for it
        # Each traced call of a custom layer is a block: `{"name", "class", "parent", "inputs"}`,
        # its inputs `(parameter, tensor)`; every graph node made while a block's call runs
        # belongs to the innermost one (`id(node) -> (node, block)`, the node kept alive).
        self.blocks = []
        self.open_blocks = []
        self.node_blocks = {}

    def patch(self, model):
        import keras

        # `ops.reshape(x, (batch_size, ...))` with `batch_size = ops.shape(x)[0]`, None while
        # tracing: the one open size is what -1 means, and the recorded node then runs at any batch.
        # With a -1 beside it (`(batch_size, -1, features)`, ViT's patches) the -1 is worked out
        # from x's other sizes, where they are known, and the open one becomes the -1.
        reshape = keras.ops.reshape

        def reshape_open(x, newshape):
            if isinstance(newshape, (tuple, list)) and sum(d is None for d in newshape) == 1:
                if -1 in newshape:
                    known = [d for d in newshape if d is not None and d != -1]
                    if x.shape[0] is not None or any(d is None for d in x.shape[1:]) or newshape[0] is not None:
                        return reshape(x, newshape)
                    inferred = int(np.prod(x.shape[1:])) // max(int(np.prod(known)), 1)
                    newshape = type(newshape)(inferred if d == -1 else d for d in newshape)
                newshape = type(newshape)(-1 if d is None else d for d in newshape)
            return reshape(x, newshape)

        self.reshape = reshape
        keras.ops.reshape = reshape_open
        # `ops.broadcast_to(x, ops.shape(inputs))` (keras_hub's PositionEmbedding) with the batch
        # open: broadcast against the traced layer's input those sizes came from (x + zeros of
        # its shape, the same values), which runs at any batch.
        broadcast_to = keras.ops.broadcast_to
        anchors = self.anchors = []
        # The open sizes may also come from a tensor the traced layer takes by keyword, so that it
        # has no anchor: keras_hub's `compute_causal_mask` (transformer_layer_utils.py) ends with
        # `ops.broadcast_to(mask, (batch_size, output_length, input_length))`, `batch_size =
        # ops.shape(decoder_sequence)[0]`, which `TransformerDecoder` (BART's, Whisper's
        # `WhisperDecoder`) and `FalconTransformerDecoder` run on `decoder_sequence=x`. The last
        # tensor with an open size that `ops.shape` was asked about while tracing stands for it.
        shape_of = keras.ops.shape
        shaped = self.shaped = []

        def shape_recorded(x):
            if isinstance(x, keras.KerasTensor) and any(d is None for d in x.shape):
                shaped[:] = [x]
            return shape_of(x)

        self.shape_of = shape_of
        keras.ops.shape = shape_recorded

        def broadcast_open(x, shape):
            if isinstance(shape, (tuple, list)) and any(d is None for d in shape) and anchors and anchors[-1] is not None:
                like = anchors[-1]
                fits = len(like.shape) == len(shape) and all(a == b for a, b in zip(like.shape, shape) if b is not None)
                if fits and all(like.shape[i] is None for i, d in enumerate(shape) if d is None):
                    return keras.ops.add(x, keras.ops.zeros_like(like))
                if shape[0] is None and like.shape[0] is None and all(d is not None for d in shape[1:]):
                    return _over_batch_of(like, broadcast_to(x, (1, *shape[1:])))
            if isinstance(shape, (tuple, list)) and any(d is None for d in shape):
                for like in [a for a in anchors[-1:] if a is not None] + shaped:
                    broadcast = _broadcast_like(x, shape, like, broadcast_to)
                    if broadcast is not None:
                        return broadcast
            return broadcast_to(x, shape)

        self.broadcast_to = broadcast_to
        keras.ops.broadcast_to = broadcast_open
        # `ops.tile(token, (batch_size, 1, 1))` (a class token, ViT's) with the batch open: the
        # other repeats, then the one row broadcast over the traced layer's batch.
        tile = keras.ops.tile

        def tile_open(x, repeats):
            if (
                isinstance(repeats, (tuple, list)) and repeats and repeats[0] is None
                and all(r is not None for r in repeats[1:]) and len(repeats) == len(x.shape) and x.shape[0] == 1
                and anchors and anchors[-1] is not None and anchors[-1].shape[0] is None
            ):
                return _over_batch_of(anchors[-1], tile(x, (1, *repeats[1:])))
            return tile(x, repeats)

        self.tile = tile
        keras.ops.tile = tile_open
        # `EinsumDense(output_shape=(None, heads, size))` keeps its None as the output's size even
        # where the input's size is known (KerasHub's attention projections): the traced layers
        # after it (a rotary embedding's `arange(seq_len)`) need the size, which the equation
        # carries over from the input.
        einsum_dense = keras.layers.EinsumDense
        self.einsum_shape = einsum_dense.__dict__["compute_output_shape"]
        own_shape = self.einsum_shape

        def einsum_shape_known(layer, input_shape):
            shape = list(own_shape(layer, input_shape))
            inputs, output = layer.equation.split(",")[0], layer.equation.split("->")[-1]
            if "." not in layer.equation and len(inputs) == len(input_shape) and len(output) == len(shape):
                for i, letter in enumerate(output):
                    if shape[i] is None and letter in inputs:
                        shape[i] = input_shape[inputs.index(letter)]
            return tuple(shape)

        einsum_dense.compute_output_shape = einsum_shape_known
        attention = keras.layers.MultiHeadAttention
        self.attention_call = attention.__dict__.get("__call__")
        attention.__call__ = _attention_with_explicit_masks(attention.__call__)
        # Every node recorded while a custom layer's call is traced belongs to that call's block.
        from keras.src.ops.node import Node

        self.node_init = Node.__init__
        node_init, node_blocks, open_blocks = self.node_init, self.node_blocks, self.open_blocks

        def node_in_block(node, *args, **kwargs):
            node_init(node, *args, **kwargs)
            if open_blocks:
                node_blocks[id(node)] = (node, open_blocks[-1])

        Node.__init__ = node_in_block

        for layer in model._flatten_layers(include_self=False, recursive=True):
            if is_builtin(layer) or not isinstance(layer, keras.layers.Layer):
                continue
            self.layers.add(id(layer))
            cls = type(layer)
            if cls not in self.classes:
                self.classes[cls] = cls.__dict__.get("__call__")  # the class's own, to put back
                cls.__call__ = self._traced_call(cls.__call__)

    def restore(self):
        import keras

        keras.ops.reshape = self.reshape
        keras.ops.broadcast_to = self.broadcast_to
        keras.ops.shape = self.shape_of
        self.shaped.clear()
        keras.ops.tile = self.tile
        keras.layers.EinsumDense.compute_output_shape = self.einsum_shape
        from keras.src.ops.node import Node

        Node.__init__ = self.node_init
        attention = keras.layers.MultiHeadAttention
        if self.attention_call is None:
            del attention.__call__
        else:
            attention.__call__ = self.attention_call
        _ATTACHED.clear()
        for cls, own in self.classes.items():
            if own is None:
                del cls.__call__
            else:
                cls.__call__ = own
        self.classes.clear()
        self.layers.clear()

    def open_block(self, layer, args, kwargs):
        """Starts the block of one traced call of `layer`: its class, where it is called from, and
        its tensor arguments by the names `call` gives them (`inputs`, `padding_mask`)."""
        try:
            bound = inspect.signature(layer.call).bind_partial(*args, **kwargs).arguments
        except TypeError:
            bound = {f"input_{i}": a for i, a in enumerate(args)}
        inputs = []
        for name, value in bound.items():
            values = value if isinstance(value, (list, tuple)) else [value]
            for k, tensor in enumerate(values):
                if hasattr(tensor, "_keras_history"):
                    inputs.append((name if len(values) == 1 else f"{name}_{k}", tensor))
        parent = self.open_blocks[-1] if self.open_blocks else None
        self.blocks.append({"name": layer.name, "class": type(layer).__name__, "parent": parent, "inputs": inputs})
        self.open_blocks.append(len(self.blocks) - 1)

    def _traced_call(self, keras_call):
        tracer = self

        def call(layer, *args, **kwargs):
            from keras.src import backend

            if id(layer) not in tracer.layers:
                return keras_call(layer, *args, **kwargs)
            reason = _untraceable(layer)
            if reason is None:
                try:
                    signature = inspect.signature(layer.call).parameters
                    if "mask" in signature and "mask" not in kwargs and args and hasattr(args[0], "shape"):
                        kwargs["mask"] = backend.get_keras_mask(args[0])
                    tracer.anchors.append(next((a for a in args if hasattr(a, "shape")), None))
                    tracer.open_block(layer, args, kwargs)
                    try:
                        outputs = _call_with_weight_nodes(layer, args, kwargs, tracer.weights)
                    finally:
                        tracer.anchors.pop()
                        tracer.open_blocks.pop()
                    _attach_mask(layer, args, kwargs, outputs)
                    tracer.report.traced.append((layer.name, type(layer).__name__))
                    return outputs
                except Exception as error:  # noqa: BLE001 - any failure keeps the layer, with why
                    where = _user_frame(error)
                    message = str(error).splitlines()[0] if str(error) else ""
                    reason = f"{type(error).__name__}: {message}" + (f" (at {where})" if where else "")
            tracer.report.kept.append((layer.name, type(layer).__name__, reason))
            # Called as Keras calls it: the custom class stays a node of the graph.
            return keras_call(layer, *args, **kwargs)

        return call


def _over_batch_of(like, row):
    """`row` (`[1, ...]`) repeated over the batch of `like` (`[B, ...]`, B open while tracing):
    `row` plus zeros `[B, 1, ...]` read from `like` (or `row | False` for a boolean), so that the
    recorded graph runs at any batch."""
    import keras

    first = like[(slice(None),) + (0,) * (len(like.shape) - 1)]  # [B]
    zeros = keras.ops.reshape(keras.ops.zeros_like(first), (-1,) + (1,) * (len(row.shape) - 1))  # [B, 1, ...]
    if "bool" in str(row.dtype):
        return keras.ops.logical_or(row, keras.ops.cast(zeros, "bool"))
    return keras.ops.add(row, keras.ops.cast(zeros, row.dtype))


def _broadcast_like(x, shape, like, broadcast_to):
    """`broadcast_to(x, shape)` where `shape`'s open sizes (None while tracing) are those of `like`,
    a tensor of its rank open at the same axes (the one `ops.shape` read them from): `x` broadcast
    to the known sizes (1 at the open ones), then repeated over `like`'s open sizes (zeros read
    from `like` added, `_over_batch_of` for the batch alone), so that the recorded graph runs at
    any batch. None where `like` does not fit, or `x` is not 1 at an open axis."""
    import keras

    axes = [i for i, d in enumerate(shape) if d is None]
    if len(like.shape) != len(shape) or any(like.shape[i] is not None for i in axes) or len(x.shape) > len(shape):
        return None
    offset = len(shape) - len(x.shape)
    if any(i >= offset and x.shape[i - offset] != 1 for i in axes):
        return None
    row = broadcast_to(x, tuple(1 if d is None else d for d in shape))
    if axes == [0]:
        return _over_batch_of(like, row)
    sizes = like[tuple(slice(None) if i in axes else 0 for i in range(len(shape)))]  # like's open sizes
    for i in range(len(shape)):
        if i not in axes:
            sizes = keras.ops.expand_dims(sizes, i)
    zeros = keras.ops.zeros_like(sizes)
    if "bool" in str(row.dtype):
        return keras.ops.logical_or(row, keras.ops.cast(zeros, "bool"))
    return keras.ops.add(row, keras.ops.cast(zeros, row.dtype))


def _attach_mask(layer, args, kwargs, outputs):
    """What `Layer.__call__` would have done with masks, which calling `call` directly skips: the
    output's Keras mask is `compute_mask(inputs, previous_mask)` when the class defines it (traced
    too, so its ops join the graph), else the previous mask when the layer supports masking. A
    later custom layer receives it as its `mask=`, which tracing records."""
    import keras
    from keras.src import backend

    if not args or not hasattr(args[0], "shape") or not hasattr(outputs, "shape"):
        return
    previous = kwargs.get("mask", backend.get_keras_mask(args[0]))
    if type(layer).compute_mask is not keras.layers.Layer.compute_mask:
        mask = layer.compute_mask(args[0], previous)
    elif layer.supports_masking:
        mask = previous
    else:
        mask = None
    if mask is not None:
        backend.set_keras_mask(outputs, mask)
        _ATTACHED.add(id(mask))


# Masks the tracer attached to traced outputs: the saved graph does not reproduce them on the
# tensors, so a built-in layer that would read one implicitly is given it explicitly.
_ATTACHED = set()


def _attention_with_explicit_masks(keras_call):
    """`MultiHeadAttention.__call__` for tracing: where its query, value or key carries a mask the
    tracer attached, the call gets Keras' own combination of them (`query_mask[:, :, None] &
    value_mask[:, None, :] & key_mask[:, None, :] & attention_mask`) as its recorded
    `attention_mask`; the attention computes the same."""
    import keras
    from keras.src import backend

    def call(layer, query, value, key=None, attention_mask=None, **kwargs):
        tensors = [query, value, value if key is None else key]
        masks = [backend.get_keras_mask(t) if hasattr(t, "shape") else None for t in tensors]
        if not any(m is not None and id(m) in _ATTACHED for m in masks):
            return keras_call(layer, query, value, key=key, attention_mask=attention_mask, **kwargs)
        query_mask, value_mask, key_mask = masks
        combined = None
        for part in (
            None if query_mask is None else ops_expand(query_mask, -1),
            None if value_mask is None else ops_expand(value_mask, -2),
            None if key_mask is None else ops_expand(key_mask, -2),
            None if attention_mask is None else keras.ops.cast(attention_mask, "bool"),
        ):
            if part is not None:
                combined = part if combined is None else keras.ops.logical_and(combined, part)
        # The saved graph keeps the explicit attention_mask; the attached masks are not saved, so
        # the reloaded attention reads no others.
        return keras_call(layer, query, value, key=key, attention_mask=combined, **kwargs)

    return call


def ops_expand(mask, axis):
    import keras

    return keras.ops.expand_dims(keras.ops.cast(mask, "bool"), axis)


def _own_variables(layer):
    """The variables of `layer` itself (not of its sublayers)."""
    sublayer_variables = {id(v) for sub in layer._flatten_layers(include_self=False) for v in sub.variables}
    return [v for v in layer.variables if id(v) not in sublayer_variables]


def _weight_attributes(layer):
    """`{attribute: variable}`: the layer's own variables held as its attributes
    (`self.position_embeddings = self.add_weight(...)`), which tracing reads through `Weight` nodes."""
    own = {id(v) for v in _own_variables(layer)}
    return {name: value for name, value in vars(layer).items() if id(value) in own}


def _untraceable(layer):
    """Why `layer` must stay as it is, or None: an own weight that `call` would read other than
    as an attribute (in a list, through a sublayer's attribute) would be frozen."""
    held = {id(v) for v in _weight_attributes(layer).values()}
    hidden = [v for v in _own_variables(layer) if id(v) not in held]
    if hidden:
        return f"reads its own weights in call ({', '.join(v.path for v in hidden)}) not held as attributes, which tracing would freeze"
    return None


def _call_with_weight_nodes(layer, args, kwargs, weights):
    """`layer.call(*args, **kwargs)` with each own weight attribute replaced, while it runs, by the
    output of a `Weight` layer standing for it (called on the first tensor argument), so that the
    traced graph reads the weight instead of freezing its value. `weights` holds one `Weight`
    layer per variable for the whole flattening: a custom layer called twice reads one weight."""
    from .weight import Weight

    attributes = _weight_attributes(layer)
    anchor = next((a for a in args if hasattr(a, "shape")), None)
    if attributes and anchor is None:
        raise ValueError("its own weights are read in call, and it has no tensor argument to tie them to")
    for name, variable in attributes.items():
        if id(variable) not in weights:
            weights[id(variable)] = Weight.standing_for(variable, f"{layer.name}_{name}")
        object.__setattr__(layer, name, weights[id(variable)](anchor))
    try:
        return layer.call(*args, **kwargs)
    finally:
        for name, variable in attributes.items():
            object.__setattr__(layer, name, variable)


def _subclassed_input(model, shapes, batch_size):
    """The one input of a subclassed model, from the shape it was built with (its build config):
    named by `shapes`' key when given (else `input`), float32 (an `Embedding` casts ids)."""
    import keras

    built = (model.get_build_config() or {}).get("input_shape")
    if built is None or not isinstance(built, (list, tuple)) or any(isinstance(d, (list, tuple, dict)) for d in built):
        raise ValueError(
            f"{model.name} ({type(model).__name__}): a subclassed model with one input, built (called once), "
            "is what can be traced; give --shape NAME=... for an unbuilt one"
        )
    name, shape = next(iter(shapes.items())) if shapes else ("input", tuple(built[1:]))
    if any(d is None for d in shape):
        raise ValueError(f"{model.name}: input sizes {shape} are open; give them with --shape {name}=D1,D2")
    return keras.Input(shape=tuple(shape), batch_size=batch_size, name=name)


def _reserve_names(model):
    """Keras names the layers and operations that tracing creates after a per-name counter
    (`add`, `add_1`): move each counter past the names the model already holds, so that a traced
    `x + y` is not a second `add`."""
    from keras.src.backend.common import global_state

    uids = global_state.get_global_attribute("object_name_uids", default=collections.defaultdict(int), set_to_default=True)
    names = set()
    stack = [model]
    while stack:
        current = stack.pop()
        inner = current._flatten_layers(include_self=False) if hasattr(current, "_flatten_layers") else []
        for operation in list(getattr(current, "operations", [])) + list(inner):
            if operation.name not in names:
                names.add(operation.name)
                stack.append(operation)
    for name in names:
        match = re.fullmatch(r"(.*)_(\d+)", name)
        prefix, number = (match.group(1), int(match.group(2))) if match else (name, 0)
        uids[prefix] = max(uids[prefix], number + 1)
        uids[name] = max(uids[name], 1)


def _qualified_names(model):
    """`{id(layer): name}` for every layer below `model`: its name prefixed by those of the layers
    holding it (`transformer_layer_0_self_attention_layer`), the first holder where it has two."""
    names = {}
    stack = [(model, None)]
    while stack:
        holder, prefix = stack.pop()
        for layer in holder._flatten_layers(include_self=False, recursive=False):
            if id(layer) not in names:
                names[id(layer)] = layer.name if prefix is None else f"{prefix}_{layer.name}"
                stack.append((layer, names[id(layer)]))
    return names


def _operations_of(outputs):
    """The operations (layers and operation nodes) the graph ending at `outputs` calls, once
    each, in the order a walk back from the outputs first meets them."""
    operations, seen, stack = [], set(), list(outputs)
    while stack:
        history = getattr(stack.pop(), "_keras_history", None)
        if history is None:
            continue
        operation = history.operation
        node = operation._inbound_nodes[history.node_index]
        if id(node) in seen:
            continue
        seen.add(id(node))
        if not any(o is operation for o in operations):
            operations.append(operation)
        stack.extend(node.input_tensors)
    return operations


def _make_names_unique(model, outputs):
    """Keras wants every operation of a model named once; tracing a custom layer that is repeated
    (two `TransformerEncoder`s) brings each one's sublayers into one graph under their own names
    (two `self_attention_layer`s). Each such sublayer takes its holder's name as a prefix
    (`transformer_layer_0_self_attention_layer`), a number after it where that is taken too. The
    layer objects are renamed (they are shared with `model`); their variables, and so the saved
    weights, are found by class and position, not by name, and stay as they were. Returns
    `{new name: the name it had}`."""
    operations = _operations_of(outputs)
    renamed = {}
    by_name = collections.defaultdict(list)
    for operation in operations:
        by_name[operation.name].append(operation)
    qualified = _qualified_names(model)
    taken = {operation.name for operation in operations}

    def rename(operation, wanted):
        new, number = wanted, 1
        while new in taken:
            new, number = f"{wanted}_{number}", number + 1
        taken.add(new)
        renamed[new] = renamed.pop(operation.name, operation.name)
        operation.name = new

    for name, clashing in by_name.items():
        if len(clashing) < 2:
            continue
        # Sublayers take their holders' names; one that is not a sublayer keeps its own.
        for operation in clashing:
            if qualified.get(id(operation), name) != name:
                rename(operation, qualified[id(operation)])
        for operation in [o for o in clashing if o.name == name][1:]:
            rename(operation, name)
    return renamed


def _block_record(flat, tracer, own_names):
    """Where each node of `flat` came from, for the torch writer (config.json's `keras2torch`):
    `blocks`, one per traced call of a custom layer that left nodes in `flat` (`name`, `class`,
    `parent` block, `inputs` as `[parameter, layer, call, tensor]`); `calls`, for each layer of
    `flat` called in a block, the block of each of its calls, in the order config.json lists
    them (None outside any); `names`, the name each renamed layer had (`_make_names_unique`)."""
    from keras.src.ops.function import make_node_key

    kept = {}  # id(node) -> (layer name, its index among the layer's calls that flat keeps)
    calls = {}
    for operation in flat.operations:
        index = 0
        blocks = []
        for position, node in enumerate(operation._inbound_nodes):
            if make_node_key(operation, position) in flat._nodes:
                kept[id(node)] = (operation.name, index)
                index += 1
                blocks.append(tracer.node_blocks.get(id(node), (None, None))[1])
        if any(block is not None for block in blocks):
            calls[operation.name] = blocks
    used = set()
    for blocks in calls.values():
        for block in blocks:
            while block is not None and block not in used:
                used.add(block)
                block = tracer.blocks[block]["parent"]
    order = sorted(used)  # a parent opens before its children
    number = {block: k for k, block in enumerate(order)}
    records = []
    for block in order:
        record = tracer.blocks[block]
        inputs = []
        for parameter, tensor in record["inputs"]:
            history = tensor._keras_history
            node = history.operation._inbound_nodes[history.node_index]
            if id(node) in kept:
                inputs.append([parameter, *kept[id(node)], history.tensor_index])
        parent = record["parent"]
        records.append({"name": record["name"], "class": record["class"],
                        "parent": None if parent is None else number[parent], "inputs": inputs})
    calls = {name: [None if b is None else number[b] for b in blocks] for name, blocks in calls.items()}
    names = {name: own for name, own in own_names.items() if any(o.name == name for o in flat.operations)}
    return {"blocks": records, "calls": calls, "names": names}


def _give_identities_a_config(flat):
    """KerasHub makes `keras.layers.Identity(dtype=policy)` (a drop path of rate 0, DINOV2's, Swin's
    identity downsample): Keras records no config for a layer built with an object argument, and
    saving raises. An Identity has no arguments of its own; its config is the base layer's."""
    import keras

    for layer in flat.layers:
        if type(layer) is keras.layers.Identity and getattr(layer, "_auto_config", True) is None:
            config = {"name": layer.name, "trainable": layer.trainable,
                      "dtype": keras.dtype_policies.serialize(layer.dtype_policy)}
            layer.get_config = lambda config=config: dict(config)


def save_flat(flat, report, path):
    """`flat.save(path)`, with `report.blocks` as config.json's `keras2torch` entry (Keras reads
    the keys it knows and no others)."""
    import zipfile

    _give_identities_a_config(flat)
    flat.save(path)
    if not report.blocks or not report.blocks["blocks"]:
        return
    with zipfile.ZipFile(path) as archive:
        members = [(info, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for info, data in members:
            if info.filename == "config.json":
                config = json.loads(data)
                config["keras2torch"] = report.blocks
                data = json.dumps(config).encode()
            archive.writestr(info, data)


def _inputs_of(model, shapes, batch_size):
    """Fresh `keras.Input`s for `model`: its inputs' names, dtypes and shapes, with `shapes` and
    `batch_size` filling sizes the model leaves open."""
    import keras

    fresh = []
    for tensor in model.inputs:
        name = tensor.name
        shape = list(shapes.get(name, tensor.shape[1:]))
        if len(shape) != len(tensor.shape) - 1:
            raise ValueError(f"--shape {name}: {len(shape)} sizes, the input has {len(tensor.shape) - 1}")
        batch = batch_size if batch_size else tensor.shape[0]
        fresh.append(keras.Input(shape=tuple(shape), batch_size=batch, dtype=tensor.dtype, name=name))
    return fresh


def _graph_of(model):
    """The functional graph of a built-in `Functional` or `Sequential` model, or None."""
    from keras.src.models.functional import Functional
    from keras.src.models.sequential import Sequential

    if isinstance(model, Sequential):
        return getattr(model, "_functional", None)
    if isinstance(model, Functional):
        return model
    return None


def _graph_only(model):
    """Whether `model` is a functional model of a class of its own that keeps `Functional.call`
    (keras.io's `MaskedLanguageModel(inputs, outputs)` overrides only training): its graph is
    its computation, re-run node by node (its own `call` would record `Functional.call`'s
    `convert_to_tensor` of the inputs as nodes too)."""
    from keras.src.models.functional import Functional

    return isinstance(model, Functional) and type(model).call is Functional.call


def _expand(model, inputs):
    """`model`'s graph re-run on `inputs` node by node, nested built-in models expanded in place
    (so custom layers inside them are traced too)."""
    graph = _graph_of(model)
    if graph is None:
        raise ValueError(f"{model.name} ({type(model).__name__}): no functional graph to re-run")

    def operation_fn(operation):
        if _graph_of(operation) is None or not is_builtin(operation):
            return operation

        def nested(*args, **kwargs):
            return _expand(operation, args[0] if len(args) == 1 else list(args))

        return nested

    return graph._run_through_graph(inputs, operation_fn=operation_fn)


def flatten(model, shapes=None, batch_size=None):
    """Returns `(flat_model, report)`: `model` with every traceable custom layer re-traced into
    built-in layers and operations, its inputs and outputs keeping their names and order.

    `shapes`: `{input name: shape without the batch axis}` for sizes the model leaves open and
    its custom layers need while tracing (`ops.arange(ops.shape(x)[1])`); `batch_size`: a static
    batch where a custom layer builds a tensor of the batch's size.
    """
    import keras
    from keras import layers

    report = FlattenReport()
    if getattr(model, "inputs", None):
        inputs = _inputs_of(model, shapes or {}, batch_size)
    else:
        inputs = [_subclassed_input(model, shapes or {}, batch_size)]
    _reserve_names(model)
    tracer = _Tracer(report)
    tracer.patch(model)
    try:
        if is_builtin(model):
            outputs = _expand(model, inputs)
        elif _graph_only(model):
            report.traced.append((model.name, type(model).__name__))
            outputs = _expand(model, inputs)
        else:
            report.traced.append((model.name, type(model).__name__))
            outputs = model.call(inputs if len(inputs) > 1 else inputs[0])
    finally:
        tracer.restore()
    flat_outputs = keras.tree.flatten(outputs)
    own_names = _make_names_unique(model, flat_outputs)
    # Keep the output names: the original outputs' layers, called again, or an Identity named so;
    # a dict of outputs (KerasHub's `{"sequence_output": ..., "pooled_output": ...}`) by its keys.
    # A subclassed model names no outputs: `output`, or `output_<i>` for several.
    if isinstance(outputs, dict):
        names = keras.tree.flatten({key: key for key in outputs})  # the keys in the outputs' order
    else:
        names = getattr(model, "output_names", None) or (
            ["output"] if len(flat_outputs) == 1 else [f"output_{i}" for i in range(len(flat_outputs))]
        )
    named = []
    for tensor, name in zip(flat_outputs, names):
        produced_by = tensor._keras_history.operation.name if hasattr(tensor, "_keras_history") else None
        if name and produced_by != name:
            tensor = layers.Identity(name=name)(tensor)
        named.append(tensor)
    structure = keras.tree.pack_sequence_as(outputs, named)
    flat = keras.Model(inputs=call_structure(model, inputs), outputs=structure, name=model.name)
    report.blocks = _block_record(flat, tracer, own_names)
    return flat, report


def call_structure(model, values):
    """`values` (one per input, in `model.inputs`' order) as `model` takes them: a dict where it
    was built on a dict of inputs (KerasHub's `{"token_ids": ..., "padding_mask": ...}`), else a
    list, or the one value alone."""
    import keras

    structure = getattr(model, "_inputs_struct", None)
    if isinstance(structure, dict):
        return keras.tree.pack_sequence_as(structure, list(values))
    return list(values) if len(values) > 1 else values[0]


def random_inputs(model, seed=0, batch=2):
    """Inputs for `model`: token ids below the smallest vocabulary of an `Embedding` reading an
    input directly (or 0..9 for other integer inputs), the later rows' second halves padding
    (id 0) so that masks matter; an integer or boolean input named as a mask (KerasHub's
    `padding_mask`) ones, zero where the ids pad; normal values otherwise; open sizes are 8."""
    import keras

    rng = np.random.default_rng(seed)
    vocab = {}
    for layer in model.layers:
        if isinstance(layer, keras.layers.Embedding):
            for node in layer._inbound_nodes:
                for tensor in node.input_tensors:
                    name = tensor._keras_history.operation.name
                    vocab[name] = min(vocab.get(name, layer.input_dim), layer.input_dim)
    values = []
    for tensor in model.inputs:
        shape = [batch] + [d if d is not None else 8 for d in tensor.shape[1:]]
        name = tensor._keras_history.operation.name
        whole = "int" in str(tensor.dtype) or "bool" in str(tensor.dtype)
        if whole and "mask" in name.lower():
            mask = np.ones(shape, dtype=bool)
            if len(shape) == 2:  # the positions the token ids pad
                mask[1:, shape[1] // 2:] = False
            values.append(mask.astype(tensor.dtype))
        elif name in vocab or "int" in str(tensor.dtype):
            ids = rng.integers(1, vocab.get(name, 10), size=shape)
            if len(shape) == 2:  # padding (id 0) at the end of the second row, so that masks matter
                ids[1:, shape[1] // 2:] = 0
            values.append(ids.astype(tensor.dtype))
        else:
            values.append(rng.normal(size=shape).astype(tensor.dtype))
    return values


def largest_difference(a, b, inputs):
    """max |a(inputs) - b(inputs)| over every output, in inference."""
    import keras

    ours = [keras.ops.convert_to_numpy(x) for x in keras.tree.flatten(a(call_structure(a, inputs), training=False))]
    theirs = [keras.ops.convert_to_numpy(y) for y in keras.tree.flatten(b(call_structure(b, inputs), training=False))]
    return max(float(np.max(np.abs(x - y))) if np.size(x) else 0.0 for x, y in zip(ours, theirs))


def import_module(path):
    """Imports a Python file (registering the custom classes it defines); returns the module."""
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None:
        raise ValueError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def custom_objects(modules):
    """`{class name: class}` of every Keras layer or model class the modules define."""
    import keras

    found = {}
    for module in modules:
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, (keras.layers.Layer, keras.Model)):
                found[name] = value
    return found


def flatten_file(path, out, imports=(), shapes=None, batch_size=None, seed=0):
    """Loads `path` with the custom classes of `imports` (files), flattens it, checks the result
    against the original on random inputs, and writes `out` (a temporary file, then a rename).
    Returns the report."""
    import keras

    modules = _import_all(imports)
    model = keras.saving.load_model(path, custom_objects=custom_objects(modules), compile=False)
    flat, report = flatten(model, shapes=shapes, batch_size=batch_size)
    report.difference = largest_difference(flat, model, random_inputs(flat, seed=seed))
    if not report.difference <= 1e-5:
        kept = "".join(f"\n  kept {name} ({cls}): {reason}" for name, cls, reason in report.kept)
        raise ValueError(
            f"the flattened model differs from the original by {report.difference:.3e} on random inputs "
            f"(masks a custom layer hands to built-in ones implicitly are not recorded by tracing); "
            f"nothing written{kept}"
        )
    directory = os.path.dirname(os.path.abspath(out))
    handle, temporary = tempfile.mkstemp(suffix=".keras", dir=directory)
    os.close(handle)
    try:
        save_flat(flat, report, temporary)
        os.replace(temporary, out)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return report


def missing_requirement():
    """What this interpreter lacks to flatten a model, in a few words, or None: numpy, Keras 3,
    or the backend Keras imports (`KERAS_BACKEND`, TensorFlow by default)."""
    if np is None:
        return "numpy is not installed"
    try:
        import keras
    except ModuleNotFoundError as error:
        if error.name == "keras":
            return "Keras 3 is not installed"
        return f"Keras cannot import its backend's module {error.name!r} (KERAS_BACKEND={os.environ.get('KERAS_BACKEND', 'tensorflow')})"
    except ImportError as error:
        return f"Keras cannot be imported ({str(error).splitlines()[0] if str(error) else type(error).__name__})"
    version = getattr(keras, "__version__", "0")
    if not version.startswith("3."):
        return f"Keras {version} is installed; Keras 3 is needed"
    return None


def _import_all(paths):
    """`import_module` of each file, a module the file itself imports and cannot find named
    with the file."""
    modules = []
    for path in paths:
        try:
            modules.append(import_module(path))
        except ModuleNotFoundError as error:
            raise ValueError(f"{path} imports {error.name!r}, which this interpreter cannot find") from None
    return modules


def shape_argument(text):
    """`NAME=D1,D2` of a command line (`--shape`) as `(name, sizes)`."""
    name, _, sizes = text.partition("=")
    if not name or not sizes:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=D1,D2,...")
    try:
        return name, tuple(int(s) for s in sizes.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the sizes are not integers") from None


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m keras2torch.flatten",
        description="Re-trace a Keras model's custom layers into built-in layers and operations, "
        "so that `cargo xtask convert` and `predict` read it.",
    )
    parser.add_argument("model", help="the .keras file")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE.py",
                        help="a Python file defining custom classes of the model (repeatable)")
    parser.add_argument("--out", required=True, help="the flattened .keras to write")
    parser.add_argument("--shape", action="append", type=shape_argument, default=[], metavar="NAME=D1,D2",
                        help="sizes (without the batch axis) of an input whose sizes the model leaves open")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="a static batch size, for custom layers that build tensors of the batch's size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs of the check")
    args = parser.parse_args(argv)
    missing = missing_requirement()
    if missing is not None:
        print(
            f"error: {sys.executable}: {missing}; install it for that interpreter, or flatten with one that "
            "has it (`cargo xtask flatten --python PATH`, or that interpreter's `-m keras2torch.flatten`); "
            "nothing written",
            file=sys.stderr,
        )
        return 1
    try:
        report = flatten_file(args.model, args.out, args.imports, dict(args.shape), args.batch_size, args.seed)
    except Exception as error:  # noqa: BLE001 - one line for the user, not a traceback
        print(f"error: {args.model}: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    for line in report.lines():
        print(line)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
