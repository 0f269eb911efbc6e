"""The verifier as float weights, read back from its int8 ONNX: where federated learning
starts from.

The repo ships only the int8 file (``artefact/``, pinned by the sha256 on its card), so
the float model a device trains is rebuilt from those bytes: every quantised weight is
decoded as ``(q - zero_point) * scale`` (per output channel for the MatMuls, per tensor
for the embedding tables) into a CrossEncoder of the same shape, and every float tensor
(biases, LayerNorms) is copied. Nothing else is trusted: the file is hash-checked first,
its shapes give the architecture, and the decoded values lie exactly on the int8 grid,
so quantising the float model again (``model.quantize_int8``) gives back the same int8
weights (tests/fl_server/test_fl_verifier.py). What differs between the float model's
probabilities and the int8 file's is only the int8 file's per-call quantisation of its
activations (measured in docs/federated-learning.md).

Imports torch and onnx: training and export only, never a lookup.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from meancache.shared.errors import VerifierError
from meancache.shared.files import sha256_file
from meancache.shared.verifier.model import CrossEncoder
from meancache.shared.verifier.runtime import MODEL_FILE, read_card

_QUANTISED = "_quantized"


@dataclass(frozen=True)
class Shape:
    """What the int8 file's tensors say about the network it was exported from."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    positions: int
    segments: int
    epsilon: float


def _initialisers(model: object) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}  # type: ignore[attr-defined]


def _consumers(model: object) -> dict[str, list[object]]:
    out: dict[str, list[object]] = {}
    for node in model.graph.node:  # type: ignore[attr-defined]
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out


def _bias_after(matmul: object, consumers: dict[str, list[object]], floats: set[str]
                ) -> str:
    """The bias a quantised MatMul's output is added to (MatMulInteger -> Cast -> Mul ->
    Add): it names the Linear the weight belongs to."""
    frontier = list(matmul.output)  # type: ignore[attr-defined]
    for _ in range(3):
        nodes = [n for name in frontier for n in consumers.get(name, [])]
        for node in nodes:
            bias = [name for name in node.input if name in floats and name.endswith(".bias")]
            if node.op_type == "Add" and bias:
                return bias[0]
        frontier = [name for n in nodes for name in n.output]
    raise VerifierError(f"the verifier's int8 file has a MatMul ({matmul.name}) with no bias "  # type: ignore[attr-defined]
                        "after it: not the network meancache exports")


def float_state(path: Path) -> tuple[dict[str, np.ndarray], Shape]:
    """The float32 weights (by the torch parameter name) and the shape of the network in
    an int8 verifier file."""
    import onnx

    model = onnx.load(str(path))
    values = _initialisers(model)
    floats = {name for name, v in values.items() if v.dtype == np.float32}
    consumers = _consumers(model)
    state = {name: values[name] for name in floats
             if name.startswith(("backbone.", "head.")) and not name.endswith(
                 ("_scale", "_zero_point"))}
    for node in model.graph.node:
        if node.op_type == "MatMulInteger":
            weight = node.input[1]
            decoded = _decode(values, weight[:-len(_QUANTISED)])  # (in, out)
            name = _bias_after(node, consumers, floats)[:-len("bias")] + "weight"
            state[name] = decoded.T.copy()
        elif node.op_type == "Gather" and node.input[0].endswith(_QUANTISED):
            stem = node.input[0][:-len(_QUANTISED)]
            state[stem] = _decode(values, stem)
    return state, _shape(model, values, state)


def _decode(values: dict[str, np.ndarray], stem: str) -> np.ndarray:
    q = values[stem + _QUANTISED].astype(np.float32)
    scale = values[stem + "_scale"].astype(np.float32)
    zero = values[stem + "_zero_point"].astype(np.float32)
    if scale.ndim == 1:  # per output channel: the last axis of the (in, out) matrix
        return (q - zero[None, :]) * scale[None, :]
    return (q - zero) * scale


def _shape(model: object, values: dict[str, np.ndarray], state: dict[str, np.ndarray]
           ) -> Shape:
    layers = sum(1 for name in state if name.endswith(".attention.self.query.weight"))
    words = state["backbone.embeddings.word_embeddings.weight"]
    hidden = int(words.shape[1])
    norm = next(n for n in model.graph.node if n.op_type == "LayerNormalization")  # type: ignore[attr-defined]
    epsilon = next((a.f for a in norm.attribute if a.name == "epsilon"), 1e-5)
    return Shape(vocab=int(words.shape[0]), hidden=hidden, layers=layers,
                 heads=hidden // _head_size(model, values),
                 intermediate=int(state["backbone.encoder.layer.0.intermediate.dense.bias"]
                                  .shape[0]),
                 positions=int(state["backbone.embeddings.position_embeddings.weight"]
                               .shape[0]),
                 segments=int(state["backbone.embeddings.token_type_embeddings.weight"]
                              .shape[0]),
                 epsilon=float(epsilon))


def _head_size(model: object, values: dict[str, np.ndarray]) -> int:
    """The attention heads' width: the last entry of the shape the first query is viewed
    as, (batch, length, -1, head size), before it is split into heads."""
    consumers = _consumers(model)
    producers = {out: n for n in model.graph.node for out in n.output}  # type: ignore[attr-defined]
    try:
        add = next(n for n in model.graph.node  # type: ignore[attr-defined]
                   if n.op_type == "Add"
                   and "backbone.encoder.layer.0.attention.self.query.bias" in n.input)
        reshape = next(n for n in consumers[add.output[0]] if n.op_type == "Reshape")  # type: ignore[attr-defined]
        size = values[producers[reshape.input[1]].input[-1]]  # type: ignore[attr-defined]
    except (StopIteration, KeyError, IndexError):
        raise VerifierError("the verifier's int8 file does not say how wide its attention "
                            "heads are: not the network meancache exports") from None
    return int(np.asarray(size).ravel()[0])


def checked_float_state(directory: Path) -> tuple[dict[str, np.ndarray], Shape]:
    """float_state of ``directory``'s int8 verifier, its card's hash checked first (a
    replaced file is refused like at run time): what the FL server starts from, which
    needs the tensors only, not the network (and so not transformers)."""
    path = directory / MODEL_FILE
    card = read_card(directory)
    if not path.is_file() or sha256_file(path) != card.sha256:
        raise VerifierError(f"the verifier model {path} is missing or not the one its card "
                            "names; it is not trained from")
    return float_state(path)


def float_verifier(directory: Path) -> CrossEncoder:
    """The CrossEncoder whose weights are those of ``directory``'s int8 verifier (its
    card's hash checked first: a replaced file is refused like at run time)."""
    import torch
    from transformers import BertConfig, BertModel

    state, shape = checked_float_state(directory)
    config = BertConfig(vocab_size=shape.vocab, hidden_size=shape.hidden,
                        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                        intermediate_size=shape.intermediate,
                        max_position_embeddings=shape.positions,
                        type_vocab_size=shape.segments, layer_norm_eps=shape.epsilon,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = CrossEncoder(BertModel(config, add_pooling_layer=False))
    params = dict(model.named_parameters())
    if set(params) != set(state):
        missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        raise VerifierError(f"the verifier's int8 file does not decode to meancache's "
                            f"network (missing {missing[:3]}, extra {extra[:3]})")
    with torch.no_grad():
        for name, param in params.items():
            if tuple(param.shape) != state[name].shape:
                raise VerifierError(f"the verifier's int8 file has {name} of shape "
                                    f"{state[name].shape}, not {tuple(param.shape)}")
            param.copy_(torch.from_numpy(np.array(state[name], dtype=np.float32)))
    return model.eval()
