"""Decode steps on ONNX Runtime with packed weights (``--precision int4``).

A decode step reads every weight once, so its speed follows the bytes of weights read
and the kernels that read them. torch's CPU low-bit kernels were slower than its float16
path for one token; ONNX Runtime's ``MatMulNBits`` (weights in symmetric blocks of 32,
each with a float32 scale, multiplied against 8-bit rounded activations on the CPU's
integer dot products) reads a fraction of float16's bytes, as llama.cpp's quantised
formats do. So a step is one ONNX graph: Gemma 3's decoder layers, final norm and output
layer written here in plain tensor operations, exported once at load and packed; the
output layer's best ``compact_weights.SHORTLIST`` words are then scored again with their
exact rows.

Widths (``BITS``), measured (docs/upstream.md, "int4 as faithful as Q4_K_M"): the
transformer layers in 8 bits, the output layer (63% of the weights) in 4. With every layer
in 4 bits the next token after a decode step was float32's in 82% of steps on Gemma 3
270M, against 97% for llama.cpp's Q4_K_M, whose file keeps these layers in 5 to 8 bits
(Q5_0, Q8_0, Q6_K; Q4_K only for the attention output and half the down projections);
no one kind in 8 bits, nor asymmetric, finer or HQQ blocks, nor float activations, lifted
it past 89%, all layers in 8 bits to 98%, at about a tenth more time a step than all-4-bit
and still less than llama.cpp's. The output layer's error is corrected by the exact
shortlist, so 4 bits cost it nothing there.

Only decode steps run here. Prompts, Prompt Cache modules and prefix blocks are read by the
torch model (in fp16-int8) into the same ``KVCache``, and each step reads the filled part of
its layers and appends its new key and value to them, so module reuse, prefix reuse, tenants
and limits work as in the other precisions. The step rounds its new key and value to the
cache's KV format (upstream.kv_rounding) before attending to them, as the torch path's
cache does, so prefills, reused states and decode steps attend to the same rounded values
in every format; one graph serves every format (an input picks the rounding). The answers
are still not float32's everywhere (8-bit weights and activations): the agreement is
reported by benchmarks/generation_speed.py, not promised.
"""

import hashlib
import io
import logging
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from meancache.upstream.errors import ModelLoadError
from meancache.upstream.kv_rounding import KVFormat
from meancache.upstream.precision import INT4_ARCHITECTURES, KV_FORMATS

if TYPE_CHECKING:
    import onnx
    from meancache.upstream.compact_weights import ShortlistOutput
    from transformers import DynamicCache, PreTrainedModel

log = logging.getLogger(__name__)

BLOCK = 32  # weights per block, each block with its own scale
INT8_ACTIVATIONS = 4  # MatMulNBits accuracy_level: activations rounded to int8 per block
# GemmaStep's MatMuls of one layer, in order, and then the output layer.
LAYER_KINDS = ("qkv", "o", "gate_up", "down")
OUTPUT = "output"
# Bits of each kind's weights (symmetric blocks of BLOCK): measured, see the docstring.
BITS: dict[str, int] = {"qkv": 8, "o": 8, "gate_up": 8, "down": 8, OUTPUT: 4}


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: scaled by (1 + weight), in float32."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def round_as_kv_format(x: torch.Tensor, kv_format: torch.Tensor) -> torch.Tensor:
    """``x`` rounded as the KV format numbered ``kv_format`` (its index in KV_FORMATS)
    holds it: KVFormat.round itself, traced once per format and picked by Where (no
    arithmetic on the picked values, so each is exactly KVFormat.round's)."""
    picked = x
    for index, name in enumerate(KV_FORMATS):
        if name != "float32":
            picked = torch.where(kv_format == index, KVFormat(name).round(x), picked)
    return picked


class GemmaStep(torch.nn.Module):
    """One decode step of a Gemma 3 model over explicit inputs, for export: the token's
    embedding ``h`` (1, hidden), the rotary cos/sin of its position for sliding and full
    layers (1, head_dim), additive masks over the cached positions and itself (1, L + 1),
    the KV format's index in KV_FORMATS (1,), and per layer the cached keys and values
    (kv_heads, L, head_dim). Returns the logits, the final hidden state and per layer the
    new key and value (kv_heads, 1, head_dim), rounded to the KV format as attended to.

    Attention reads the cache without concatenating it (scores against the cache and
    against the new key are joined instead), so a step copies no cached state. Linear
    weights are held transposed so that each is a MatMul the quantiser can pack; those
    that read the same input are joined into one (q, k and v; gate and up): 4 MatMuls a
    layer instead of 7, each wider, so fewer thread-pool rounds a step for the same bytes
    (each output column is quantised, and computed, as it would be alone)."""

    def __init__(self, model: "PreTrainedModel") -> None:
        super().__init__()
        config = model.config
        self.eps = config.rms_norm_eps
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scaling = config.query_pre_attn_scalar ** -0.5
        self.sliding = [kind == "sliding_attention" for kind in config.layer_types]
        self.linears = torch.nn.ParameterList()
        self.norms = torch.nn.ParameterList()
        for layer in model.model.layers:  # q, k, v as one MatMul, gate and up as one
            attn, mlp = layer.self_attn, layer.mlp
            for linears in ((attn.q_proj, attn.k_proj, attn.v_proj), (attn.o_proj,),
                            (mlp.gate_proj, mlp.up_proj), (mlp.down_proj,)):
                self.linears.append(_frozen(torch.cat([linear.weight for linear in linears]).t()))
            for norm in (layer.input_layernorm, attn.q_norm, attn.k_norm,
                         layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
                         layer.post_feedforward_layernorm):
                self.norms.append(_frozen(norm.weight.float()))
        self.final_norm = _frozen(model.model.norm.weight.float())
        self.output = _frozen(model.get_output_embeddings().weight.t())

    def forward(self, h: torch.Tensor, cos_s: torch.Tensor, sin_s: torch.Tensor,
                cos_f: torch.Tensor, sin_f: torch.Tensor, mask_s: torch.Tensor,
                mask_f: torch.Tensor, kv_format: torch.Tensor, *past: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        group = self.heads // self.kv_heads
        new: list[torch.Tensor] = []
        for i, sliding in enumerate(self.sliding):
            w_qkv, wo, w_gate_up, wd = self.linears[4 * i:4 * i + 4]
            n_in, n_q, n_k, n_attn, n_pre, n_post = self.norms[6 * i:6 * i + 6]
            cos, sin, mask = (cos_s, sin_s, mask_s) if sliding else (cos_f, sin_f, mask_f)
            keys, values = past[2 * i], past[2 * i + 1]
            x = _rms(h, n_in, self.eps)
            q, k, v = (x @ w_qkv).split([self.heads * self.head_dim,
                                         self.kv_heads * self.head_dim,
                                         self.kv_heads * self.head_dim], dim=-1)
            q = _rotate(_rms(q.reshape(self.kv_heads, group, self.head_dim), n_q, self.eps),
                        cos, sin)
            k = _rotate(_rms(k.reshape(self.kv_heads, 1, self.head_dim), n_k, self.eps),
                        cos, sin)
            v = v.reshape(self.kv_heads, 1, self.head_dim)
            k, v = round_as_kv_format(k, kv_format), round_as_kv_format(v, kv_format)
            scores = torch.cat([q @ keys.transpose(1, 2), (q * k).sum(-1, keepdim=True)], -1)
            p = torch.softmax(scores * self.scaling + mask, dim=-1)
            cached = keys.shape[1]
            attended = p[..., :cached] @ values + p[..., cached:] * v
            h = h + _rms(attended.reshape(1, self.heads * self.head_dim) @ wo, n_attn, self.eps)
            x = _rms(h, n_pre, self.eps)
            gate, up = (x @ w_gate_up).chunk(2, dim=-1)
            mlp = torch.nn.functional.gelu(gate, approximate="tanh") * up
            h = h + _rms(mlp @ wd, n_post, self.eps)
            new += [k, v]
        h = _rms(h, self.final_norm, self.eps)
        return (h @ self.output, h, *new)


def _frozen(tensor: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(tensor.detach().float().contiguous(), requires_grad=False)


def export_step(model: "PreTrainedModel", bits: Mapping[str, int] | None = BITS,
                accuracy_level: int = INT8_ACTIVATIONS) -> bytes:
    """The decode step of ``model`` as a serialized ONNX model, each kind of linear layer
    packed in blocks of its ``bits`` (None: left in float32, for checking the graph)."""
    config = model.config
    if config.model_type not in INT4_ARCHITECTURES:
        raise ModelLoadError(f"int4 decoding supports {', '.join(INT4_ARCHITECTURES)}; "
                             f"{config.model_type} is not one: serve it in float32 or "
                             "fp16-int8")
    import onnx

    layers, cached = config.num_hidden_layers, 2
    past = [torch.zeros(config.num_key_value_heads, cached, config.head_dim)
            for _ in range(2 * layers)]
    example = (torch.zeros(1, config.hidden_size), *[torch.zeros(1, config.head_dim)] * 4,
               *[torch.zeros(1, cached + 1)] * 2, torch.zeros(1, dtype=torch.long), *past)
    # sliding layers may hold fewer states than full ones (prompt_cache.states.out_of_window)
    held = ["seen_s" if kind == "sliding_attention" else "seen_f" for kind in config.layer_types]
    growing = {"mask_s": {1: "seen_s"}, "mask_f": {1: "seen_f"},
               **{f"past_{i}": {1: held[i // 2]} for i in range(2 * layers)}}
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter is marked deprecated
        torch.onnx.export(GemmaStep(model).eval(), example, buffer, dynamo=False,
                          opset_version=21, dynamic_axes=growing,
                          input_names=["h", "cos_s", "sin_s", "cos_f", "sin_f", "mask_s",
                                       "mask_f", "kv_format",
                                       *(f"past_{i}" for i in range(2 * layers))],
                          output_names=["logits", "hidden",
                                        *(f"new_{i}" for i in range(2 * layers))])
    graph = onnx.load_from_string(buffer.getvalue())
    if bits is not None:
        graph = _pack(graph, bits, accuracy_level)
    return graph.SerializeToString()


def _kinds(graph: "onnx.ModelProto") -> dict[str, str]:
    """The weight MatMuls of the step graph by node name, with their kind: GemmaStep's
    ``linears.N`` is kind LAYER_KINDS[N % 4] of its layer, ``output`` the output layer."""
    weights = {tensor.name for tensor in graph.graph.initializer}
    kinds = {}
    for node in graph.graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights:
            name = node.input[1]
            kinds[node.name] = (OUTPUT if name == OUTPUT
                                else LAYER_KINDS[int(name.removeprefix("linears.")) % 4])
    return kinds


def _pack(graph: "onnx.ModelProto", bits: Mapping[str, int], accuracy_level: int
          ) -> "onnx.ModelProto":
    """``graph`` with each weight MatMul a MatMulNBits of its kind's ``bits``: one
    quantiser pass per bit width, the other kinds' nodes excluded from it."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    kinds = _kinds(graph)
    for width in sorted(set(bits.values())):
        others = [node for node, kind in kinds.items() if bits[kind] != width]
        quantizer = MatMulNBitsQuantizer(graph, bits=width, block_size=BLOCK,
                                         is_symmetric=True, accuracy_level=accuracy_level,
                                         nodes_to_exclude=others)
        quantizer.process()
        graph = quantizer.model.model
    return graph


class OnnxDecoder:
    """Runs decode steps of a torch-loaded Gemma 3 model on its exported step graph."""

    def __init__(self, model: "PreTrainedModel", graph: bytes | Path, threads: int) -> None:
        """``graph``: the step graph's bytes or its file (upstream.decode_graph_cache)."""
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Idle threads sleep rather than spin: a spinning pool holds the cores after each
        # run, against the step's own work between runs and any other process's.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self.session: onnxruntime.InferenceSession = onnxruntime.InferenceSession(
            str(graph) if isinstance(graph, Path) else graph, options,
            providers=["CPUExecutionProvider"])
        self.model = model
        self.window = int(model.config.sliding_window)
        self.layers = model.config.num_hidden_layers
        rotary = model.model.rotary_emb  # its frequencies and scale, per layer type
        self.rotary = {kind: (getattr(rotary, f"{kind}_inv_freq").float().numpy(),
                              np.float32(getattr(rotary, f"{kind}_attention_scaling")))
                       for kind in ("sliding_attention", "full_attention")}

    def _shortlist(self) -> "ShortlistOutput | None":
        from meancache.upstream.compact_weights import ShortlistOutput

        output = self.model.get_output_embeddings()
        return output if isinstance(output, ShortlistOutput) else None

    def _rotary(self, kind: str, position: int) -> tuple[np.ndarray, np.ndarray]:
        """The rotary cos and sin at ``position`` (1, head_dim), as the model's rotary
        embedding computes them (its float32 product of position and frequency, then cos
        and sin), in numpy: a handful of values, not worth a torch call between runs."""
        inv_freq, scaling = self.rotary[kind]
        freqs = np.float32(position) * inv_freq
        angles = np.concatenate([freqs, freqs])[None]
        return np.cos(angles) * scaling, np.sin(angles) * scaling

    @torch.inference_mode()
    def step(self, token: int, position: int, seen: torch.Tensor, cache: "DynamicCache",
             kv_format: KVFormat, sliding_skip: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """As PromptCacheEngine.decode_step: logits after ``token`` at ``position``, which
        sees every position in ``seen`` and itself; its key and value, rounded to
        ``kv_format`` (the cache's), join ``cache``, whose sliding layers lack the first
        ``sliding_skip`` entries of ``seen`` (KVCache.sliding_skip)."""
        h = self.model.get_input_embeddings()(torch.tensor([[token]]))[0].float()
        cos_s, sin_s = self._rotary("sliding_attention", position)
        cos_f, sin_f = self._rotary("full_attention", position)
        seen = torch.cat([seen, torch.tensor([position])])
        near = (position - seen[sliding_skip:] < self.window)[None]  # measured in positions
        floor = np.finfo(np.float32).min
        feeds = {"h": h.numpy(), "cos_s": cos_s, "sin_s": sin_s, "cos_f": cos_f, "sin_f": sin_f,
                 "mask_s": np.where(near.numpy(), 0, floor).astype(np.float32),
                 "mask_f": np.zeros((1, seen.numel()), np.float32),
                 "kv_format": np.array([KV_FORMATS.index(kv_format.name)], np.int64)}
        for i, layer in enumerate(cache.layers):  # keys/values: the filled part, no room
            feeds[f"past_{2 * i}"] = layer.keys[0].float().numpy()
            feeds[f"past_{2 * i + 1}"] = layer.values[0].float().numpy()
        out = self.session.run(None, feeds)
        for i, layer in enumerate(cache.layers):  # rounded by the graph: appended as they are
            dtype = layer.keys.dtype
            layer.update(torch.from_numpy(out[2 + 2 * i])[None].to(dtype),
                         torch.from_numpy(out[3 + 2 * i])[None].to(dtype))
        logits = torch.from_numpy(out[0][0])
        shortlist = self._shortlist()
        if shortlist is not None:
            logits = shortlist.rescore(torch.from_numpy(out[1][0]), logits)
        return logits, seen


def onnx_decoder(model: "PreTrainedModel", bits: Mapping[str, int] | None = BITS,
                 accuracy_level: int = INT8_ACTIVATIONS,
                 cache_dir: Path | None = None) -> OnnxDecoder:
    """The 4-bit decoder of ``model``, built from its weights as they are now (call it
    before compacting them); with ``cache_dir``, its graph is kept there and read back by
    later starts (upstream.decode_graph_cache)."""
    graph: bytes | Path
    if cache_dir is None:
        graph = export_step(model, bits, accuracy_level)
    else:
        from meancache.upstream import decode_graph_cache, kv_rounding, precision

        # The code that writes the graph is part of its name: a change to it builds anew.
        sources = [hashlib.sha256(Path(str(path)).read_bytes()).hexdigest()
                   for path in (__file__, kv_rounding.__file__, precision.__file__)]
        settings = {"bits": bits, "block": BLOCK, "accuracy_level": accuracy_level,
                    "sources": sources}
        graph = decode_graph_cache.cached_graph(
            cache_dir, decode_graph_cache.graph_key(model, settings),
            lambda: export_step(model, bits, accuracy_level))
    log.info("%s: decode steps on ONNX Runtime, weights in blocks of %d, bits %s",
             model.config.model_type, BLOCK, bits or "32 (float)")
    return OnnxDecoder(model, graph, torch.get_num_threads())
