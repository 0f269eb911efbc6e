"""Mining pairs for the teacher: every shared question set read, QQP dev and the held-out
sets never mined, each pair a question and one of its nearest in the band, once, with a
seeded split fixed by the pair itself. The packaged MiniLM embeds (real neighbours); a
tiny random encoder where only the mechanics count (a killed run resumed, the cap's
sample)."""

import argparse
import json
import random
import string
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from meancache.shared.encoder import Encoder
from meancache.shared.errors import VerifierError
from meancache.shared.verifier.embedding_shards import embed_resumably
from meancache.shared.verifier.mine import (
    SPLITS,
    Question,
    mine_pairs,
    question_sets,
    sample_sources,
    shards_dir,
    split_of,
)
from meancache.shared.verifier.training_commands import _exclude

from tests.support.shared_data import write_data_root
from tests.support.tiny_encoder import make_tiny_encoder

TRAIN = [("What is the capital of France?", "Which city is the capital of France?", 1),
         ("How do I learn Python quickly?", "What is the fastest way to learn Python?", 1),
         ("How tall is Mount Everest?", "How high is Mount Everest?", 1),
         ("Why is the sky blue?", "What makes the sky look blue?", 1),
         ("How do I bake bread?", "Why do cats purr?", 0)]
DEV = [("What is the capital of Spain?", "Which city is the capital of Spain?", 1)]
HELD = [("How can I lose weight fast?", "How can I gain weight fast?", 0)]


def _data_root(root: Path) -> Path:
    arena = ["How can I lose weight fast?", "What's the capital city\u2028of France?",
             "Write a poem about the sea. " * 20]
    sharegpt = ["How do I learn python fast?", "what is the capital of spain?"]
    return write_data_root(
        root, [(a, b, y, "train") for a, b, y in TRAIN] + [(a, b, y, "dev") for a, b, y in DEV],
        arena, sharegpt, [("Why is the sky blue during the day?", "And why is it red at sunset?")],
        ["How tall is Everest?", "How do cats purr?"])


@pytest.fixture(scope="module")
def mined(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list[dict]]:
    root = _data_root(tmp_path_factory.mktemp("shared-data"))
    held = root / "held.jsonl"
    held.write_text("".join(json.dumps({"q1": a, "q2": b, "label": y}) + "\n"
                            for a, b, y in HELD))
    out = root / "mined.jsonl"
    encoder = Encoder.load(None)
    summary = mine_pairs(root, out, encoder.encode, encoder.version, low=0.6, per_question=2,
                         limit=1000, max_chars=300, seed=5, exclude=(held,))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return root, summary, rows


def test_every_set_is_read_and_dev_held_out_and_long_texts_are_not(
        mined: tuple[Path, dict, list[dict]]) -> None:
    root, summary, rows = mined
    questions = question_sets(root, 300, (root / "held.jsonl",))
    texts = {q.text.lower() for q in questions}
    assert {"what is the capital of spain?", "which city is the capital of spain?",
            "how can i lose weight fast?"}.isdisjoint(texts)  # QQP dev, held out (any case)
    assert not any(len(q.text) > 300 for q in questions)
    assert summary["questions"] == {"qqp-train": 10, "arena": 1, "sharegpt": 1,
                                    "contextual": 4}
    for row in rows:
        assert {row["q1"].lower(), row["q2"].lower()} <= texts


def test_a_malformed_set_is_named_with_its_line(tmp_path: Path) -> None:
    root = _data_root(tmp_path)
    path = root / "instructions" / "arena_first_turns.jsonl"
    path.write_text(path.read_text() + '{"id": "x", "txt": "no text"}\n')
    with pytest.raises(VerifierError,
                       match=r"arena_first_turns.jsonl:4: not a JSON object with .*'text'"):
        question_sets(root, 300)


def test_pairs_are_near_neighbours_in_the_band_each_once(
        mined: tuple[Path, dict, list[dict]]) -> None:
    root, summary, rows = mined
    questions = question_sets(root, 300, (root / "held.jsonl",))
    vectors = Encoder.load(None).encode([q.text for q in questions])
    index = {q.text: i for i, q in enumerate(questions)}
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -1.0)
    rank = np.argsort(-sims, axis=1)
    seen = set()
    for row in rows:
        a, b = index[row["q1"]], index[row["q2"]]
        assert a != b and frozenset((a, b)) not in seen
        seen.add(frozenset((a, b)))
        assert row["cosine"] >= 0.6 and abs(row["cosine"] - sims[a, b]) < 1e-4
        assert b in rank[a, :2] or a in rank[b, :2]
    assert summary["pairs"] == len(rows) > 0
    assert sum(summary["splits"].values()) == len(rows)
    asked = {frozenset((r["q1"], r["q2"])) for r in rows}
    assert frozenset(("What is the capital of France?",
                      "Which city is the capital of France?")) in asked


@given(st.lists(st.text(string.ascii_letters + " ?", min_size=1, max_size=30), min_size=2,
                max_size=2), st.integers(0, 2 ** 31))
def test_a_pairs_split_is_fixed_by_the_pair_and_the_seed(texts: list[str],
                                                          seed: int) -> None:
    q1, q2 = texts
    assert split_of(q1, q2, seed) == split_of(q2, q1, seed) == split_of(
        q1.upper(), f"  {q2} ", seed)


def test_splits_take_their_shares() -> None:
    seed = random.randrange(2 ** 31)
    print(f"seed {seed}")
    rng = random.Random(seed)
    n = 20_000
    names = [split_of(f"q{rng.random()}", f"r{rng.random()}", seed) for _ in range(n)]
    for name, share in SPLITS:
        # 5 standard deviations of a binomial share: fails by chance about once in 3 million
        assert abs(names.count(name) / n - share) < 5 * (share * (1 - share) / n) ** 0.5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    return Encoder.load(make_tiny_encoder(tmp_path_factory.mktemp("tiny")), backend="torch")


class Killed(KeyboardInterrupt):
    """What a kill looks like to the run: it stops mid-chunk, nothing after runs."""


def test_a_killed_run_resumed_writes_the_pairs_of_one_that_never_stopped(
        tiny: Encoder, tmp_path: Path) -> None:
    root = _data_root(tmp_path / "data")
    options = {"low": 0.0, "per_question": 2, "seed": 1, "chunk": 3}
    whole = tmp_path / "whole" / "pairs.jsonl"
    whole.parent.mkdir()
    summary = mine_pairs(root, whole, tiny.encode, "tiny", **options)
    texts = [q.text for q in question_sets(root, 300)]
    chunks = -(-len(texts) // 3)
    kill_at = random.randrange(2, chunks + 1)  # any chunk after the first, the last included
    print(f"killed in chunk {kill_at} of {chunks}")
    calls: list[list[str]] = []

    def dying(part: list[str]) -> np.ndarray:
        calls.append(part)
        if len(calls) == kill_at:
            raise Killed
        return tiny.encode(part)

    out = tmp_path / "parts" / "pairs.jsonl"
    out.parent.mkdir()
    with pytest.raises(Killed):
        mine_pairs(root, out, dying, "tiny", **options)
    assert not out.exists()
    assert len(list(shards_dir(out).glob("shard-*.npz"))) == kill_at - 1
    resumed: list[str] = []

    def recording(part: list[str]) -> np.ndarray:
        resumed.extend(part)
        return tiny.encode(part)

    again = mine_pairs(root, out, recording, "tiny", **options)
    done = 3 * (kill_at - 1)
    assert [t for part in calls[:kill_at - 1] for t in part] == texts[:done]
    assert resumed == texts[done:]  # each text embedded once in all
    assert again["embeddings"]["reused"] == done
    assert out.read_bytes() == whole.read_bytes() and summary["pairs"] > 0
    assert mine_pairs(root, out, recording, "tiny", **options)["embeddings"]["embedded"] == 0


def test_a_larger_cap_reuses_the_smaller_ones_vectors_and_another_space_is_refused(
        tiny: Encoder, tmp_path: Path) -> None:
    root = _data_root(tmp_path / "data")
    out = tmp_path / "pairs.jsonl"
    small = mine_pairs(root, out, tiny.encode, "tiny", low=0.0, per_source=1, chunk=4)
    assert small["questions"] == {"qqp-train": 1, "arena": 1, "sharegpt": 1, "contextual": 1}
    assert small["per_source"] == 1 and small["embeddings"]["embedded"] == 4
    large = mine_pairs(root, out, tiny.encode, "tiny", low=0.0, chunk=4)
    assert large["embeddings"] == {**small["embeddings"], "reused": 4,
                                   "embedded": len(question_sets(root, 300)) - 4}
    with pytest.raises(VerifierError, match=r"another vector space \(tiny, not other\)"):
        mine_pairs(root, out, tiny.encode, "other", low=0.0)
    shard = sorted(shards_dir(out).glob("shard-*.npz"))[-1]
    shard.write_bytes(shard.read_bytes()[:40])
    with pytest.raises(VerifierError, match=rf"shard {shard} cannot be read"):
        mine_pairs(root, out, tiny.encode, "tiny", low=0.0)


def test_shards_key_vectors_by_the_exact_text(tiny: Encoder, tmp_path: Path) -> None:
    """Texts NumPy's own strings would change (a trailing NUL) come back as they went."""
    texts = ["What is x?\x00", "What is x?", "\u2028why\n"]
    first, reused = embed_resumably(texts, tiny.encode, tmp_path, "tiny", chunk=2)
    again, reused_again = embed_resumably(texts[::-1], tiny.encode, tmp_path, "tiny")
    assert reused == 0 and reused_again == 3
    assert np.array_equal(again, first[::-1])


@given(st.lists(st.sampled_from(["qqp-train", "arena", "sharegpt"]), max_size=40),
       st.integers(1, 12), st.integers(1, 12), st.integers(0, 2 ** 31))
def test_the_cap_keeps_each_sources_seeded_sample_nested_in_any_larger_caps(
        sources: list[str], cap: int, more: int, seed: int) -> None:
    questions = [Question(f"q{i}", source) for i, source in enumerate(sources)]
    sample = sample_sources(questions, cap, seed)
    assert sample == sample_sources(questions, cap, seed)  # the seed fixes it
    assert sample == [q for q in questions if q in sample]  # in the sets' own order
    for source in set(sources):
        assert sum(q.source == source for q in sample) == min(cap, sources.count(source))
    assert set(sample) <= set(sample_sources(questions, cap + more, seed))
    assert sample_sources(questions, None, seed) == questions


def test_the_held_out_sets_are_left_out_from_any_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from elsewhere with --data-root, mining found no tests/data there and left the
    held-out near-miss sets' questions in without a word."""
    monkeypatch.chdir(tmp_path)
    excluded = _exclude(argparse.Namespace(exclude=None))
    assert [p.name for p in excluded] == ["near_miss.jsonl", "near_miss_heldout.jsonl"]
    assert all(p.is_file() for p in excluded)
