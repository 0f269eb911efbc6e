"""The encoder: packaged MiniLM, ONNX backend and its fallback, versions, PCA, truncation."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import meancache.shared.encoder._onnx as onnx_module
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from meancache.shared.encoder import Encoder, PCAProjection, locate_model, packaged_minilm_dir
from meancache.shared.encoder.checked_export import record_path
from meancache.shared.encoder.fingerprint import model_fingerprint
from meancache.shared.errors import EncoderError, ModelNotFoundError
from meancache.shared.threshold import DEFAULT_THRESHOLD

from tests.support.tiny_encoder import make_tiny_encoder

# The tests marked kernels compare a PyTorch computation with another or with ONNX Runtime:
# CI runs them on AVX2 kernels too. That rerun changes only PyTorch's side (ATen, oneDNN,
# fbgemm); ONNX Runtime picks its own kernels, so a test of ONNX Runtime alone, or of no
# numbers, would rerun what the plain suite ran.

QUERIES = [
    "What is the capital of France?",
    "hi",
    "How do I reverse a linked list in Python without using extra memory?",
    "¿Cuál es la mejor manera de aprender a programar?",
    "Explain, step by step, how public key cryptography lets two strangers agree on a "
    "secret over an open channel that an attacker can read, and why it is hard to break.",
]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


# loading ---------------------------------------------------------------------------------
def test_default_is_the_packaged_minilm(encoder: Encoder) -> None:
    assert encoder.model_dir == packaged_minilm_dir()
    assert encoder.dim == encoder.full_dim == 384
    assert encoder.max_tokens == 256
    vectors = encoder.encode(QUERIES[:3])
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    "name", [None, "", "default", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"]
)
def test_default_names_resolve_to_the_packaged_model(name: str | None) -> None:
    assert locate_model(name) == packaged_minilm_dir()


def test_a_paraphrase_is_closer_than_an_unrelated_sentence(encoder: Encoder) -> None:
    base, paraphrase, unrelated = encoder.encode([
        "What is the capital of France?",
        "Which city is the capital of France?",
        "How do I bake sourdough bread at home?",
    ])
    assert base @ paraphrase > DEFAULT_THRESHOLD
    assert base @ unrelated < 0.5
    assert base @ paraphrase > base @ unrelated


def test_a_remote_model_name_is_not_downloaded(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # so the name cannot resolve to a directory by accident
    with pytest.raises(ModelNotFoundError) as info:
        Encoder.load("sentence-transformers/paraphrase-MiniLM-L3-v2")
    message = str(info.value)
    assert "paraphrase-MiniLM-L3-v2" in message
    assert "nor a local directory" in message
    assert "never downloads" in message
    assert "pass that path" in message  # how to point at a local copy


def test_a_directory_without_a_model_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("not a model")
    with pytest.raises(ModelNotFoundError, match="no sentence-transformers model") as info:
        Encoder.load(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_a_broken_model_directory_raises_encoder_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{ this is not json")
    with pytest.raises(EncoderError, match="could not load") as info:
        Encoder.load(tmp_path, backend="torch")
    assert not isinstance(info.value, ModelNotFoundError)


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(EncoderError, match="unknown encoder backend"):
        Encoder.load(backend="tensorflow")


# ONNX backend ----------------------------------------------------------------------------
@pytest.mark.kernels
def test_onnx_backend_is_active(encoder: Encoder, encoder_cache_dir: Path) -> None:
    assert encoder.backend == "onnx"
    assert encoder.fallback_reason is None
    assert (encoder_cache_dir / "onnx" / f"{encoder.version}.onnx").is_file()


@pytest.mark.kernels
def test_onnx_matches_torch(encoder: Encoder, torch_encoder: Encoder) -> None:
    assert torch_encoder.backend == "torch"
    assert cosines(encoder.encode(QUERIES), torch_encoder.encode(QUERIES)).min() >= 0.999


def test_batching_and_padding_do_not_change_embeddings(encoder: Encoder) -> None:
    """Texts are sorted by length and padded per batch; each row must still be its own text's
    embedding, whatever else shares the batch."""
    together = encoder.encode(QUERIES, batch_size=2)
    alone = np.vstack([encoder.encode([q]) for q in QUERIES])
    assert cosines(together, alone).min() >= 0.9999
    assert cosines(together[[0]], together[[2]])[0] < 0.9  # rows are not mixed up


def test_encode_reports_progress(encoder: Encoder) -> None:
    calls: list[tuple[int, int]] = []
    out = encoder.encode(QUERIES, batch_size=2, progress=lambda d, t: calls.append((d, t)))
    assert out.shape == (5, 384)
    assert calls == [(2, 5), (4, 5), (5, 5)]


def test_encode_of_nothing_is_empty(encoder: Encoder) -> None:
    assert encoder.encode([]).shape == (0, 384)


def test_no_cache_dir_falls_back_to_torch() -> None:
    enc = Encoder.load()
    assert enc.backend == "torch"
    assert "cache directory" in (enc.fallback_reason or "")


@pytest.mark.kernels
def test_failed_export_falls_back_to_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           encoder: Encoder) -> None:
    def broken_export(*args: object, **kwargs: object) -> None:
        raise RuntimeError("exporter exploded")

    monkeypatch.setattr(onnx_module, "export_pipeline", broken_export)
    enc = Encoder.load(cache_dir=tmp_path)
    assert enc.backend == "torch"
    assert enc.fallback_reason is not None
    assert "RuntimeError" in enc.fallback_reason and "exporter exploded" in enc.fallback_reason
    assert cosines(enc.encode(QUERIES), encoder.encode(QUERIES)).min() >= 0.999


@pytest.mark.kernels
def test_cache_dir_that_is_a_file_falls_back_to_torch(tmp_path: Path, encoder: Encoder) -> None:
    not_a_dir = tmp_path / "cache-dir"
    not_a_dir.write_text("a regular file where the encoder cache should be")
    enc = Encoder.load(cache_dir=not_a_dir)
    assert enc.backend == "torch"
    assert enc.fallback_reason is not None and str(not_a_dir) in enc.fallback_reason
    assert cosines(enc.encode(QUERIES[:2]), encoder.encode(QUERIES[:2])).min() >= 0.999


def test_failed_parity_check_falls_back_and_discards_the_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoder: Encoder, encoder_cache_dir: Path
) -> None:
    exported = tmp_path / "onnx" / f"{encoder.version}.onnx"
    exported.parent.mkdir()
    shutil.copy(encoder_cache_dir / "onnx" / exported.name, exported)
    monkeypatch.setattr(onnx_module, "PARITY_MIN_COSINE", 1.5)  # no export can pass
    enc = Encoder.load(cache_dir=tmp_path)
    assert enc.backend == "torch"
    assert "parity" in (enc.fallback_reason or "")
    assert not exported.exists()  # the next start tries a fresh export


def test_with_pca_keeps_an_explicit_torch_backend(encoder_cache_dir: Path) -> None:
    """An encoder asked for PyTorch (e.g. for training) must stay on PyTorch."""
    enc = Encoder.load(backend="torch", cache_dir=encoder_cache_dir)
    assert enc.with_pca(None).backend == "torch"


# versions --------------------------------------------------------------------------------
def test_version_is_stable_across_loads_and_backends(
    encoder: Encoder, torch_encoder: Encoder
) -> None:
    again = Encoder.load(backend="torch")
    assert again.version == encoder.version == torch_encoder.version
    assert again.base_version == encoder.base_version
    assert len(encoder.version) == 16 and int(encoder.version, 16) >= 0


def test_version_changes_with_a_pca_layer(
    torch_encoder: Encoder, pca16: PCAProjection
) -> None:
    with_pca = torch_encoder.with_pca(pca16)
    assert with_pca.version != torch_encoder.version
    assert with_pca.base_version == torch_encoder.base_version
    same = PCAProjection(np.array(pca16.components, order="C"),
                         pca16.mean.copy())  # equal values, another object
    assert torch_encoder.with_pca(same).version == with_pca.version
    other = PCAProjection(pca16.components[::-1].copy(), pca16.mean.copy())
    assert torch_encoder.with_pca(other).version != with_pca.version
    assert with_pca.with_pca(None).version == torch_encoder.version


def test_a_pca_layer_cannot_change_under_its_version(pca16: PCAProjection) -> None:
    """The version is hashed once: the layer owns its arrays and they are read-only."""
    source = np.array(pca16.components, order="C")
    layer = PCAProjection(source, pca16.mean.copy())
    version = layer.version
    source[0, 0] += 1.0  # the caller's array is not the layer's
    with pytest.raises(ValueError, match="read-only"):
        layer.components[0, 0] = 0.0
    with pytest.raises(ValueError, match="read-only"):
        layer.mean += 1.0
    assert layer.version == version == PCAProjection(layer.components, layer.mean).version


def test_fingerprint_follows_file_contents(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "bert"}')
    (model / "model.safetensors").write_bytes(b"weights-1")
    memo = tmp_path / "memo" / "fingerprints.json"
    first = model_fingerprint(model, memo)
    assert memo.is_file()
    assert model_fingerprint(model, memo) == first == model_fingerprint(model)
    (model / "model.safetensors").write_bytes(b"weights-2 (longer)")
    assert model_fingerprint(model, memo) != first


# PCA -------------------------------------------------------------------------------------
def test_pca_fit_shapes(pca16: PCAProjection) -> None:
    assert (pca16.in_dim, pca16.out_dim) == (384, 16)
    rows = pca16.components
    np.testing.assert_allclose(rows @ rows.T, np.eye(16), atol=1e-4)  # orthonormal directions


@pytest.mark.kernels
def test_pca_encoder_gives_projected_unit_vectors(
    torch_encoder: Encoder, pca16: PCAProjection
) -> None:
    enc = torch_encoder.with_pca(pca16)
    assert enc.dim == 16 and enc.full_dim == 384
    out = enc.encode(QUERIES)
    assert out.shape == (5, 16)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    full = enc.encode_full(QUERIES)
    assert full.shape == (5, 384)
    expected = pca16.project(full)
    assert cosines(out, expected).min() >= 0.999


def test_pca_save_load_round_trip(pca16: PCAProjection, tmp_path: Path) -> None:
    path = tmp_path / "sub" / "pca.safetensors"
    pca16.save(path)
    loaded = PCAProjection.load(path)
    assert loaded.version == pca16.version
    np.testing.assert_array_equal(loaded.components, pca16.components)
    np.testing.assert_array_equal(loaded.mean, pca16.mean)


def test_pca_needs_enough_embeddings() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        PCAProjection.fit(np.random.default_rng(0).normal(size=(10, 384)), dims=16)


def test_pca_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError):
        PCAProjection(np.zeros((4, 8), dtype=np.float32), np.zeros(7, dtype=np.float32))


@pytest.mark.kernels
def test_onnx_with_pca_matches_torch(
    encoder: Encoder, torch_encoder: Encoder, pca16: PCAProjection
) -> None:
    onnx = encoder.with_pca(pca16)
    assert onnx.backend == "onnx" and onnx.dim == 16
    reference = torch_encoder.with_pca(pca16).encode(QUERIES)
    assert cosines(onnx.encode(QUERIES), reference).min() >= 0.999


# long input ------------------------------------------------------------------------------
def test_long_input_is_flagged_truncated(encoder: Encoder) -> None:
    long_text = "tell me more about the history of the roman empire " * 40
    assert encoder.count_tokens(long_text) > encoder.max_tokens
    assert encoder.is_truncated(long_text) and not encoder.is_truncated("short question")
    tokens = encoder.tokenize([long_text, "short question"])
    assert tokens.input_ids.shape[1] == encoder.max_tokens
    vector = encoder.encode([long_text])
    assert vector.shape == (1, 384) and np.isfinite(vector).all()


def test_pca_layers_share_the_base_export(
    encoder: Encoder, pca16: PCAProjection, encoder_cache_dir: Path
) -> None:
    """PCA runs after the ONNX graph: a new layer needs no new export (MPNet's is 440 MB)."""
    exports = sorted((encoder_cache_dir / "onnx").glob("*.onnx"))
    reduced = encoder.with_pca(pca16)
    assert reduced.backend == "onnx"
    assert sorted((encoder_cache_dir / "onnx").glob("*.onnx")) == exports
    full = encoder.encode(QUERIES)
    assert cosines(reduced.project(full), reduced.encode(QUERIES)).min() >= 0.9999
    assert cosines(encoder.encode_full(QUERIES), full).min() >= 0.9999


def test_an_onnx_encoder_releases_its_pytorch_weights(encoder: Encoder) -> None:
    """onnxruntime holds the weights; a second copy in PyTorch would double the memory."""
    with pytest.raises(EncoderError, match="backend='torch'"):
        _ = encoder.sentence_transformer
    assert encoder.encode(QUERIES[:1]).shape == (1, encoder.dim)
    assert encoder.count_tokens("What is the capital of France?") > 5


# a checked export runs alone ---------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=400), min_size=1, max_size=4))
def test_the_tokenizer_matches_the_models_own(torch_encoder: Encoder,
                                              texts: list[str]) -> None:
    """What the export runs on must be tokenised as the PyTorch model tokenises: the
    model's Hugging Face tokenizer called as sentence-transformers' users call it."""
    model = torch_encoder.sentence_transformer.tokenizer
    expected = model(texts, padding=True, truncation=True, max_length=torch_encoder.max_tokens,
                     return_tensors="np")
    tokens = torch_encoder.tokenize(texts)
    np.testing.assert_array_equal(tokens.input_ids, expected["input_ids"])
    np.testing.assert_array_equal(tokens.attention_mask, expected["attention_mask"])
    assert [torch_encoder.count_tokens(t) for t in texts] == \
        [len(model(t, truncation=False)["input_ids"]) for t in texts]


def isolated(tmp_path: Path, encoder: Encoder, encoder_cache_dir: Path) -> Path:
    """A cache dir of its own holding a copy of the session's checked export and record."""
    export = encoder_cache_dir / "onnx" / f"{encoder.version}.onnx"
    (tmp_path / "onnx").mkdir()
    for each in (export, record_path(export)):
        shutil.copy(each, tmp_path / "onnx" / each.name)
    return tmp_path


def test_a_checked_export_starts_without_torch(encoder: Encoder,
                                               encoder_cache_dir: Path) -> None:
    """The second start of an ONNX encoder loads neither torch nor the PyTorch model (about
    4 s of a start for MPNet), and gives the vectors the checked start gave."""
    assert record_path(encoder_cache_dir / "onnx" / f"{encoder.version}.onnx").is_file()
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from meancache.shared.encoder import Encoder\n"
        f"enc = Encoder.load(cache_dir=Path({str(encoder_cache_dir)!r}))\n"
        f"vectors = enc.encode({QUERIES!r})\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'sentence_transformers', "
        "'sklearn') if m in sys.modules)\n"
        "print(json.dumps({'heavy': heavy, 'backend': enc.backend, 'version': enc.version, "
        "'max_tokens': enc.max_tokens, 'dim': enc.dim, 'vectors': vectors.tolist()}))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    alone = json.loads(run.stdout)
    assert alone["heavy"] == []
    assert (alone["backend"], alone["version"], alone["max_tokens"], alone["dim"]) == \
        (encoder.backend, encoder.version, encoder.max_tokens, encoder.dim)
    # the same graph on the same inputs: only the float32 summation order may differ
    assert cosines(np.array(alone["vectors"]), encoder.encode(QUERIES)).min() >= 1 - 1e-6
    with pytest.raises(EncoderError, match="backend='torch'"):
        _ = Encoder.load(cache_dir=encoder_cache_dir).sentence_transformer


@pytest.mark.parametrize("damage", ["another size", "not json", "a broken tokenizer"])
def test_a_record_that_does_not_describe_the_export_is_checked_afresh(
    tmp_path: Path, encoder: Encoder, encoder_cache_dir: Path, damage: str
) -> None:
    cache_dir = isolated(tmp_path, encoder, encoder_cache_dir)
    export = cache_dir / "onnx" / f"{encoder.version}.onnx"
    record = json.loads(record_path(export).read_text())
    if damage == "another size":
        record["size"] += 1
        record_path(export).write_text(json.dumps(record))
    elif damage == "not json":
        record_path(export).write_text("{truncated")
    else:
        record["tokenizer"]["pipeline"] = "{}"
        record_path(export).write_text(json.dumps(record))
    enc = Encoder.load(cache_dir=cache_dir)
    assert enc.backend == "onnx" and enc.fallback_reason is None
    assert json.loads(record_path(export).read_text())["size"] == export.stat().st_size
    assert cosines(enc.encode(QUERIES), encoder.encode(QUERIES)).min() >= 1 - 1e-6


def test_a_record_without_its_export_is_not_trusted(tmp_path: Path) -> None:
    """On a tiny random-init model: exporting MiniLM afresh costs about 17 CPU-s."""
    model, cache_dir = make_tiny_encoder(tmp_path / "model"), tmp_path / "cache"
    version = Encoder.load(model, cache_dir=cache_dir).version  # exported and recorded
    export = cache_dir / "onnx" / f"{version}.onnx"
    export.unlink()
    enc = Encoder.load(model, cache_dir=cache_dir)  # exports afresh, then records that export
    assert enc.backend == "onnx" and enc.fallback_reason is None and export.is_file()
    assert json.loads(record_path(export).read_text())["size"] == export.stat().st_size


# int8 ------------------------------------------------------------------------------------
def with_float32_export(encoder: Encoder, encoder_cache_dir: Path, directory: Path) -> Path:
    """A cache dir holding a copy of the float32 export (the int8 variant deletes it)."""
    full = encoder_cache_dir / "onnx" / f"{encoder.version}.onnx"
    (directory / "onnx").mkdir()
    return Path(shutil.copy(full, directory / "onnx" / full.name))


@pytest.mark.kernels
def test_the_int8_backend_quantises_every_weight_matrix_and_passes_its_check(
    tmp_path: Path, encoder: Encoder, encoder_cache_dir: Path, torch_encoder: Encoder
) -> None:
    import onnx

    full = with_float32_export(encoder, encoder_cache_dir, tmp_path)
    enc = Encoder.load(backend="onnx-int8", cache_dir=tmp_path)
    assert enc.backend == "onnx-int8" and enc.fallback_reason is None
    graph = onnx.load(str(full.with_suffix(".int8.onnx"))).graph
    matrices = {init.name for init in graph.initializer if len(init.dims) == 2}
    assert not [n.name for n in graph.node if n.op_type == "MatMul" and matrices & set(n.input)]
    assert sum(n.op_type == "MatMulNBits" for n in graph.node) >= 6 * 6  # 6 per layer
    assert not full.exists()  # only the variant in use is kept on disk
    assert cosines(enc.encode(QUERIES), torch_encoder.encode(QUERIES)).min() >= 0.99
    assert cosines(enc.encode(QUERIES), encoder.encode(QUERIES)).min() < 0.99999  # int8 ran
    assert enc.version == encoder.version  # the same vector space: no re-embedding
    assert not record_path(full).exists()  # nor is its record
    again = Encoder.load(backend="onnx-int8", cache_dir=tmp_path)  # from the int8 file alone
    assert again.backend == "onnx-int8" and not full.exists()
    assert cosines(again.encode(QUERIES), enc.encode(QUERIES)).min() >= 1 - 1e-6


def test_an_int8_vector_does_not_depend_on_the_batch(
    tmp_path: Path, encoder: Encoder, encoder_cache_dir: Path
) -> None:
    """Activations are quantised per token and block, not per call: a question embedded
    beside a long one (padding, other tokens) gets its lone vector. What may differ is
    the order of float additions, a few float32 epsilons per sum."""
    with_float32_export(encoder, encoder_cache_dir, tmp_path)
    enc = Encoder.load(backend="onnx-int8", cache_dir=tmp_path)
    alone = np.concatenate([enc.encode([q]) for q in QUERIES])
    together = enc.encode([*QUERIES, "word " * 200], batch_size=len(QUERIES) + 1)
    assert cosines(together[:len(QUERIES)], alone).min() >= 1 - 1e-5


def test_an_int8_variant_failing_its_check_falls_back_to_float32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoder: Encoder, encoder_cache_dir: Path
) -> None:
    full = with_float32_export(encoder, encoder_cache_dir, tmp_path)
    monkeypatch.setattr(onnx_module, "INT8_PARITY_MIN_COSINE", 1.5)  # no variant can pass
    enc = Encoder.load(backend="onnx-int8", cache_dir=tmp_path)
    assert enc.backend == "onnx" and enc.fallback_reason is None
    assert full.exists() and not full.with_suffix(".int8.onnx").exists()
    assert cosines(enc.encode(QUERIES), encoder.encode(QUERIES)).min() >= 0.99999
