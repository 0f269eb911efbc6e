"""The KV formats: each rounds within the bound its definition gives, stores what it
rounded without loss, and costs the bytes per token the docs state."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from meancache.upstream.kv_rounding import KVFormat
from meancache.upstream.precision import KV_FORMATS
from meancache.upstream.prompt_cache.states import bytes_per_token
from transformers import Gemma3TextConfig

from tests.support.kv_reference import error_bound


@settings(max_examples=60, deadline=None)
@given(kv_format=st.sampled_from(KV_FORMATS), seed=st.integers(0, 2**32 - 1),
       exponent=st.integers(-30, 13), rows=st.integers(1, 5), width=st.integers(1, 70))
def test_rounding_stays_within_the_formats_bound_and_packs_without_loss(
    kv_format: str, seed: int, exponent: int, rows: int, width: int,
) -> None:
    """Random rows whose magnitudes span 2^-8 below 2^exponent (float16 subnormals up to
    values near its largest, 65504), one row of zeros."""
    print(f"seed {seed}")  # noqa: T201 - fuzz inputs are reproducible from it
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 2, rows, width, generator=generator) * 2.0**exponent
    x *= 2.0 ** torch.randint(-8, 1, x.shape, generator=generator)
    x[0, 0, 0] = 0.0
    fmt = KVFormat(kv_format)
    rounded = fmt.round(x)
    assert ((rounded - x).abs() <= error_bound(kv_format, x)).all()
    out = torch.empty_like(x)
    fmt.unpack_into(fmt.pack(rounded), out)
    # float formats store the rounded values exactly; int8 recomputes its scale from them
    tolerance = 2 * torch.finfo(torch.float32).eps * rounded.abs() if kv_format == "int8" else 0
    assert ((out - rounded).abs() <= tolerance).all()
    assert fmt.head_dim(fmt.pack(rounded)) == width


def test_float16_clamps_beyond_its_range_instead_of_overflowing() -> None:
    x = torch.tensor([1e6, -1e6, 3.0])
    assert KVFormat("float16").round(x).tolist() == [65504.0, -65504.0, 3.0]


@pytest.mark.parametrize(("kv_format", "expected"), [
    ("float32", 36_864), ("float16", 18_432), ("bfloat16", 18_432), ("int8", 9_360)])
def test_gemma_3_270m_bytes_per_cached_token(kv_format: str, expected: int) -> None:
    """Gemma 3 270M: 18 layers, 1 key/value head of 256: 36,864 bytes a token in float32."""
    config = Gemma3TextConfig(num_hidden_layers=18, num_attention_heads=4,
                              num_key_value_heads=1, head_dim=256, hidden_size=640)
    model = SimpleNamespace(config=config)
    assert bytes_per_token(model, KVFormat(kv_format)) == expected  # type: ignore[arg-type]


def test_an_unknown_format_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="float16, bfloat16, int8"):
        KVFormat("float8")
