"""Precision ``int4``: Gemma 3 decode steps on ONNX Runtime, 4-bit weights. The step graph
is checked against the torch model in float32 (same arithmetic, other summation orders),
the 4-bit kernel against the bound its rounding gives, and the engine's paths (modules,
prefix reuse, plain prompts) against each other."""

import io
import random
from collections import Counter

import numpy as np
import pytest
import torch
from meancache.upstream.errors import ModelLoadError
from meancache.upstream.kv_rounding import KVFormat
from meancache.upstream.model_loading import load_model
from meancache.upstream.onnx_decode import (
    BITS,
    BLOCK,
    LAYER_KINDS,
    OUTPUT,
    OnnxDecoder,
    export_step,
    onnx_decoder,
    round_as_kv_format,
)
from meancache.upstream.precision import KV_FORMATS
from meancache.upstream.prompt_cache.engine import Finish, PromptCacheEngine
from meancache.upstream.prompt_cache.kv_format import KVCache
from meancache.upstream.sampling import SamplingParams

from tests.support.kv_reference import error_bound

# Compares the results of numeric kernels: CI runs these on AVX2 kernels too.
pytestmark = pytest.mark.kernels

DOC = ('<schema name="doc"><module name="text">A document about rivers and the bridges '
       "over them, and the towns between the bridges.</module></schema>")
ASK = '<prompt schema="doc"><text/>Summarise it in a few words.</prompt>'


def close(ours: torch.Tensor, reference: torch.Tensor, slack: float = 0.0) -> bool:
    """Equal up to float32 rounding in sums of a few hundred terms: the graph and torch
    add the same products in other orders (observed differences are ~1e-7), and ``slack``."""
    return bool(((ours - reference).abs()
                 <= 1e-4 * (1 + reference.abs().max()) + slack).all())


def as_float32_cache(cache: KVCache) -> KVCache:
    """A copy of ``cache`` that keeps what it holds but rounds nothing new."""
    copy = KVCache(KVFormat("float32"))
    skips = [cache.held_from(i) for i in range(len(cache.layers))]
    copy.fill([layer.keys.clone() for layer in cache.layers],
              [layer.values.clone() for layer in cache.layers],
              cache.layers[0].keys.shape[2] + skips[0], skips)
    return copy


def new_states(cache: KVCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's key and value of the position the last step added."""
    return [(layer.keys[:, :, -1:], layer.values[:, :, -1:]) for layer in cache.layers]


def decode_both(engine: PromptCacheEngine, decoder: OnnxDecoder, messages: list[dict],
                steps: int) -> None:
    """Prefill twice (one cache each), then step the torch model and the decoder on the
    same tokens from the same states and compare each step's logits and new states.

    Both round their new key and value to the engine's KV format before attending to
    them. Computed in other summation orders, the two can straddle a rounding boundary of
    the format and land one step of it apart (tests.support.kv_reference). Where every
    rounded state agrees up to float32 rounding (int8's scales, from sums, differ in their
    last bits), the logits agree to float32 rounding. Where a layer's states straddled,
    what the layers after it attend to differs by a step of the format, so their states,
    and the logits, agree to that plus 2 x D, D being how far the format's rounding of this
    step's states moves the torch model's (its states and logits, against a step that
    rounds nothing new). The torch cache then takes the decoder's states, so that each
    step starts from the same states."""
    fmt = engine.kv_format
    prepared = engine.prepare_messages(messages)
    logits, seen, cache = engine.prefill(prepared)
    _, seen_onnx, cache_onnx = engine.prefill(prepared)
    position, token = max(prepared.new_positions), int(logits.argmax())
    agreed = 0
    for _ in range(steps):
        position += 1
        unrounded, before = as_float32_cache(cache), seen
        reference, seen = engine.decode_step(token, position, seen, cache)
        ours, seen_onnx = decoder.step(token, position, seen_onnx, cache_onnx, fmt,
                                       cache_onnx.sliding_skip)
        assert torch.equal(seen, seen_onnx)
        layers = list(zip(new_states(cache_onnx), new_states(cache), strict=True))
        straddled = [not all(close(m, t) for m, t in zip(*layer, strict=True))
                     for layer in layers]
        if any(straddled):
            exact, _ = engine.decode_step(token, position, before, unrounded)
            first = straddled.index(True)
            moved = [2 * max(float((t - e).abs().max()) for t, e in zip(theirs, exact_states,
                                                                        strict=True))
                     if i > first else 0.0
                     for i, ((_, theirs), exact_states)
                     in enumerate(zip(layers, new_states(unrounded), strict=True))]
        else:
            moved = [0.0] * len(layers)
        for (mine_kv, theirs_kv), slack in zip(layers, moved, strict=True):
            for mine, theirs in zip(mine_kv, theirs_kv, strict=True):
                on_grid = (2 * torch.finfo(torch.float32).eps * mine.abs()
                           if fmt.name == "int8" else 0)
                assert ((fmt.round(mine) - mine).abs() <= on_grid).all()  # rounded as the format
                step = 2 * error_bound(fmt.name, torch.maximum(mine.abs(), theirs.abs()))
                assert close(mine, theirs, step + slack), float((mine - theirs).abs().max())
        if any(straddled):
            slack = 2 * float((reference - exact).abs().max())
            assert close(ours, reference, slack), float((ours - reference).abs().max())
        else:
            agreed += 1
            assert close(ours, reference), float((ours - reference).abs().max())
        with torch.inference_mode():
            for (mine_kv, theirs_kv) in layers:
                for mine, theirs in zip(mine_kv, theirs_kv, strict=True):
                    theirs.copy_(mine)
        token = int(reference.argmax())
    assert agreed > steps // 2  # a straddled rounding is rare: most steps agree exactly


@pytest.mark.parametrize("kv_format", KV_FORMATS)
def test_the_float32_step_graph_computes_the_models_decode_steps(kv_format: str) -> None:
    """Plain prompts, a reused PML module (positions with a gap) and a reused prefix, each
    decoded past the sliding window (tiny-gemma3's is 12), as torch decodes them, in each
    KV format."""
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    engine = PromptCacheEngine(load_model("builtin:tiny-gemma3", device="cpu"), block_tokens=4,
                               kv_format=kv_format)
    decoder = OnnxDecoder(engine.model, export_step(engine.model, bits=None), 1)
    words = ["river", "bridge", "town", "stone", "water", "boat", "road", "hill"]
    question = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
    decode_both(engine, decoder, [{"role": "user", "content": question}], 20)
    decode_both(engine, decoder, [{"role": "user", "content": question}], 20)  # prefix hit
    engine.add_schema(DOC)
    decode_both(engine, decoder, [{"role": "user", "content": ASK}], 20)


class Rounding(torch.nn.Module):
    def forward(self, x: torch.Tensor, kv_format: torch.Tensor) -> torch.Tensor:
        return round_as_kv_format(x, kv_format)


@pytest.mark.parametrize("kv_format", KV_FORMATS)
def test_the_graph_rounds_states_as_the_kv_format_does_bit_for_bit(kv_format: str) -> None:
    """ONNX Runtime's Cast, Round and division give KVFormat.round's values bit for bit,
    but for the sign of a zero (a negative value under float16's range casts to +0 there,
    -0 in torch: the same number to every sum and product attention makes): on random
    rows over float16's subnormals to past its largest value, ties of each format (round
    half to even), a row of zeros and an int8 row whose codes fall on halves."""
    from onnxruntime import InferenceSession

    seed = random.randrange(2**32)
    print(f"seed {seed}")
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 40, 16, generator=generator) * 2.0 ** torch.randint(
        -30, 18, (2, 40, 1), generator=generator).float()
    ties = [1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 2.0**-25,
            3 * 2.0**-25, 65519.0, 65520.0, 1e6, -1e6, 127.0, 0.5, 1.5, 2.5, -0.5, -2.5]
    x[0, 0] = torch.tensor(ties)
    x[0, 1] = 0.0
    x[1, 0] = torch.tensor([127.0, *(k + 0.5 for k in range(-7, 8))])  # int8 scale 1
    buffer = io.BytesIO()
    index = torch.tensor([KV_FORMATS.index(kv_format)])
    torch.onnx.export(Rounding(), (x, index), buffer, dynamo=False, opset_version=21,
                      input_names=["x", "kv_format"])
    session = InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    ours = torch.from_numpy(session.run(None, {"x": x.numpy(), "kv_format": index.numpy()})[0])
    rounded = KVFormat(kv_format).round(x)
    same_bits = ours.view(torch.int32) == rounded.view(torch.int32)
    assert (same_bits | ((ours == 0) & (rounded == 0))).all()


def snap_to_4_bits(model: torch.nn.Module) -> None:
    """Round every linear weight to the symmetric 4-bit grid of its blocks, with one
    weight per block at -8 steps, so that the quantiser's scale (largest |w| / 8) is the
    grid's step and quantising loses nothing; in 8 bits too (the weight at -8 steps is
    -128 of its scale, a sixteenth of the 4-bit step, so each value is an integer of it)."""
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
    decoder = onnx_decoder(loaded.model, accuracy_level=0)  # the served widths (4 or 8)
    decode_both(engine, decoder, [{"role": "user", "content": "rivers and bridges"}], 16)


def test_each_kind_of_weight_is_packed_in_its_measured_bits() -> None:
    """Every weight MatMul of the served graph is a MatMulNBits of its kind's width in
    BITS (the widths the agreement table measured), none is left in float32."""
    import onnx

    model = load_model("builtin:tiny-gemma3", device="cpu").model
    graph = onnx.load_from_string(export_step(model)).graph
    weights = {tensor.name for tensor in graph.initializer}
    assert not [node.name for node in graph.node
                if node.op_type == "MatMul" and node.input[1] in weights]
    widths = Counter(onnx.helper.get_attribute_value(attribute)
                     for node in graph.node if node.op_type == "MatMulNBits"
                     for attribute in node.attribute if attribute.name == "bits")
    layers = model.config.num_hidden_layers
    expected = Counter({BITS[OUTPUT]: 1})
    for kind in LAYER_KINDS:
        expected[BITS[kind]] += layers
    assert widths == expected


@pytest.mark.parametrize("bits", sorted(set(BITS.values())))
def test_the_int8_activation_kernel_keeps_within_its_rounding_bound(bits: int) -> None:
    """At accuracy level 4 (served), with each served weight width, each block of 32
    activations is rounded to int8 with step s_b = max |x_b| / 127, so |error| <= sum_b
    s_b / 2 * sum_(k in b) |w_k| beside float32 rounding; it must also differ from
    float32 somewhere (int8 ran)."""
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
        bits=bits, block_size=BLOCK, is_symmetric=True, accuracy_level=4)
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


def test_auto_serves_gemma3_in_int4_with_modules_and_prefixes_through_the_engine() -> None:
    loaded = load_model("builtin:tiny-gemma3", device="cpu", precision="auto")
    assert loaded.precision == "int4" and isinstance(loaded.decoder, OnnxDecoder)
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
