"""Precision ``int4``: Gemma 3 decode steps on ONNX Runtime, 4-bit weights. The step graph
is checked against the torch model in float32 (same arithmetic, other summation orders),
the 4-bit kernel against the bound its rounding gives, and the engine's paths (modules,
prefix reuse, plain prompts) against each other."""

import random

import numpy as np
import pytest
import torch
from meancache.upstream.errors import ModelLoadError
from meancache.upstream.model_loading import load_model
from meancache.upstream.onnx_decode import BLOCK, OnnxDecoder, export_step, onnx_decoder
from meancache.upstream.prompt_cache.engine import Finish, PromptCacheEngine
from meancache.upstream.sampling import SamplingParams

# Compares the results of numeric kernels: CI runs these on AVX2 kernels too.
pytestmark = pytest.mark.kernels

DOC = ('<schema name="doc"><module name="text">A document about rivers and the bridges '
       "over them, and the towns between the bridges.</module></schema>")
ASK = '<prompt schema="doc"><text/>Summarise it in a few words.</prompt>'


def close(ours: torch.Tensor, reference: torch.Tensor) -> bool:
    """Equal up to float32 rounding in sums of a few hundred terms: the graph and torch
    add the same products in other orders (observed differences are ~1e-7)."""
    return bool(((ours - reference).abs() <= 1e-4 * (1 + reference.abs().max())).all())


def decode_both(engine: PromptCacheEngine, decoder: OnnxDecoder, messages: list[dict],
                steps: int) -> None:
    """Prefill twice (one cache each), then step the torch model and the decoder on the
    same tokens and compare every step's logits."""
    prepared = engine.prepare_messages(messages)
    logits, seen, cache = engine.prefill(prepared)
    _, seen_onnx, cache_onnx = engine.prefill(prepared)
    position, token = max(prepared.new_positions), int(logits.argmax())
    for _ in range(steps):
        position += 1
        reference, seen = engine.decode_step(token, position, seen, cache)
        ours, seen_onnx = decoder.step(token, position, seen_onnx, cache_onnx)
        assert torch.equal(seen, seen_onnx)
        assert close(ours, reference), float((ours - reference).abs().max())
        token = int(reference.argmax())
    for theirs, ours_layer in zip(cache.layers, cache_onnx.layers, strict=True):
        assert close(ours_layer.keys, theirs.keys) and close(ours_layer.values, theirs.values)


def test_the_float32_step_graph_computes_the_models_decode_steps() -> None:
    """Plain prompts, a reused PML module (positions with a gap) and a reused prefix, each
    decoded past the sliding window (tiny-gemma3's is 12), as torch decodes them."""
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    engine = PromptCacheEngine(load_model("builtin:tiny-gemma3", device="cpu"), block_tokens=4)
    decoder = OnnxDecoder(engine.model, export_step(engine.model, bits=None), 1)
    words = ["river", "bridge", "town", "stone", "water", "boat", "road", "hill"]
    question = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
    decode_both(engine, decoder, [{"role": "user", "content": question}], 20)
    decode_both(engine, decoder, [{"role": "user", "content": question}], 20)  # prefix hit
    engine.add_schema(DOC)
    decode_both(engine, decoder, [{"role": "user", "content": ASK}], 20)


def snap_to_4_bits(model: torch.nn.Module) -> None:
    """Round every linear weight to the symmetric 4-bit grid of its blocks, with one
    weight per block at -8 steps, so that the quantiser's scale (largest |w| / 8) is the
    grid's step and quantising loses nothing."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                w = module.weight.view(module.out_features, -1, BLOCK)
                step = w.abs().amax(-1, keepdim=True) / 8
                grid = (w / step.clamp(min=1e-30)).round().clamp(-8, 7)  # 0 stays 0
                grid[..., 0] = -8
                w.copy_(grid * step)


def test_4_bit_weights_on_their_grid_decode_as_float32_with_float32_activations() -> None:
    """With weights the 4-bit format holds exactly and activations kept in float32
    (accuracy level 0), the packed graph gives the float32 model's logits: the packing,
    scales and block layout are right."""
    loaded = load_model("builtin:tiny-gemma3", device="cpu")
    snap_to_4_bits(loaded.model)
    engine = PromptCacheEngine(loaded)
    decoder = onnx_decoder(loaded.model, bits=4, accuracy_level=0)
    decode_both(engine, decoder, [{"role": "user", "content": "rivers and bridges"}], 16)


def test_the_int8_activation_kernel_keeps_within_its_rounding_bound() -> None:
    """At accuracy level 4 (served), each block of 32 activations is rounded to int8 with
    step s_b = max |x_b| / 127, so |error| <= sum_b s_b / 2 * sum_(k in b) |w_k| beside
    float32 rounding; it must also differ from float32 somewhere (int8 ran)."""
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime import InferenceSession, SessionOptions
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    k, n = 8 * BLOCK, 96
    layer = torch.nn.Linear(k, n, bias=False)
    layer.weight.data = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32))
    snap_to_4_bits(layer)
    w = layer.weight.detach().numpy().T.copy()  # (k, n), as the step graph's MatMuls hold it
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [numpy_helper.from_array(w, "w")])
    quantizer = MatMulNBitsQuantizer(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
        bits=4, block_size=BLOCK, is_symmetric=True, accuracy_level=4)
    quantizer.process()
    assert {node.op_type for node in quantizer.model.model.graph.node} == {"MatMulNBits"}
    options = SessionOptions()
    options.intra_op_num_threads = 1
    session = InferenceSession(quantizer.model.model.SerializeToString(), options,
                               providers=["CPUExecutionProvider"])
    moved = False
    for _ in range(50):
        x = (rng.standard_normal((1, k)) * rng.uniform(0.01, 10, (1, k))).astype(np.float32)
        exact = x.astype(np.float64) @ w.astype(np.float64)
        y = session.run(None, {"x": x})[0]
        steps = np.abs(x.reshape(-1, BLOCK)).max(1) / 127
        bound = (steps[:, None] / 2 * np.abs(w).reshape(-1, BLOCK, n).sum(1)).sum(0)
        bound = bound + k * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w))
        assert (np.abs(y - exact) <= bound).all()
        moved |= bool((np.abs(y - exact) > k * np.finfo(np.float32).eps
                       * (np.abs(x) @ np.abs(w))).any())
    assert moved


def test_int4_serves_modules_and_prefixes_through_the_engine() -> None:
    loaded = load_model("builtin:tiny-gemma3", device="cpu", precision="int4")
    assert isinstance(loaded.decoder, OnnxDecoder)
    engine = PromptCacheEngine(loaded)
    engine.add_schema(DOC)
    params = SamplingParams(max_tokens=24, temperature=0.0)
    for messages in ([{"role": "user", "content": ASK}], [{"role": "user", "content": ASK}],
                     [{"role": "user", "content": "rivers and bridges, and towns"}]):
        finish = list(engine.generate(engine.prepare_messages(messages), params))[-1]
        assert isinstance(finish, Finish) and finish.completion_tokens > 1
    assert finish.cached_tokens == 0  # the first plain prompt: nothing to reuse yet
    repeated = list(engine.generate(engine.prepare_messages(messages), params))[-1]
    assert repeated.prefix_tokens > 0  # the plain prompt's prefix, reused the second time
    assert repeated.completion_tokens > 1


def test_int4_refuses_a_model_it_cannot_decode_by_name() -> None:
    with pytest.raises(ModelLoadError, match="int4 decoding supports gemma3_text; llama"):
        load_model("builtin:tiny", device="cpu", precision="int4")
