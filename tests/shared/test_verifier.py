"""The learned verifier's mechanics, on a tiny random-init cross-encoder made the way the
shipped one is: the pair as one sequence, one batched call for many candidates, and a
model file refused unless its hash is the one its card names."""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from meancache.shared.errors import VerifierError
from meancache.shared.verifier import negatives
from meancache.shared.verifier.runtime import CARD_FILE, MODEL_FILE, LearnedVerifier
from meancache.shared.verifier.tokens import tokenize_pairs

from tests.support.tiny_verifier import built_tiny_verifier

CANDIDATES = ["What is the capital of France?", "Which city is France's capital?",
              "What is the capital of Spain?"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_tiny_verifier(tmp_path_factory)


def test_a_pair_is_one_sequence_cls_q1_sep_q2_sep() -> None:
    batch = tokenize_pairs(["Is it safe?"], ["Is it dangerous?"])
    ids, types = batch.input_ids[0].tolist(), batch.token_type_ids[0].tolist()
    cls, sep = 101, 102  # BERT's [CLS] and [SEP] in MiniLM's vocabulary
    assert ids[0] == cls and ids.count(sep) == 2 and ids[-1] == sep
    second = ids.index(sep) + 1  # the second question's tokens carry segment 1
    assert set(types[:second]) == {0} and set(types[second:]) == {1}


def test_pairs_are_padded_to_the_longest_and_cut_at_the_limit() -> None:
    long = "word " * 200
    batch = tokenize_pairs(["hi", long], ["hello", long], max_tokens=32)
    assert batch.input_ids.shape == (2, 32)
    assert batch.attention_mask[0].sum() < 32 and batch.attention_mask[1].sum() == 32
    with pytest.raises(ValueError, match="2 first questions for 1"):
        tokenize_pairs(["a", "b"], ["c"])


def test_a_pairs_probability_does_not_depend_on_the_pairs_scored_with_it(
        tiny_dir: Path) -> None:
    """int8 activations are quantised per onnxruntime call: a pair scored beside others
    would get another probability. Each pair is scored alone, so the decision on a lone
    candidate and on five is made on the same number (bit-equal, not merely close)."""
    verifier = LearnedVerifier.load(tiny_dir)
    probabilities = verifier.probabilities("What's the capital of France?", CANDIDATES)
    assert probabilities.shape == (3,)
    assert np.all((probabilities > 0) & (probabilities < 1))
    alone = [verifier.probabilities("What's the capital of France?", [c])[0]
             for c in CANDIDATES]
    assert probabilities.tolist() == alone
    reordered = verifier.probabilities("What's the capital of France?", CANDIDATES[::-1])
    assert reordered.tolist() == probabilities[::-1].tolist()
    with_long = verifier.pair_probabilities(
        ["What's the capital of France?"] * 4, [*CANDIDATES, "word " * 60])
    assert with_long[:3].tolist() == probabilities.tolist()
    assert verifier.probabilities("anything", []).shape == (0,)


def test_a_model_file_that_is_not_the_one_its_card_names_is_refused(
        tiny_dir: Path, tmp_path: Path) -> None:
    altered = tmp_path / "altered"
    altered.mkdir()
    data = bytearray((tiny_dir / MODEL_FILE).read_bytes())
    data[-1] ^= 0xFF
    (altered / MODEL_FILE).write_bytes(bytes(data))
    (altered / CARD_FILE).write_bytes((tiny_dir / CARD_FILE).read_bytes())
    with pytest.raises(VerifierError, match="damaged or was replaced; it is not loaded"):
        LearnedVerifier.load(altered)
    (altered / CARD_FILE).write_text("{not json", encoding="utf-8")
    with pytest.raises(VerifierError, match="card .* is missing or unreadable"):
        LearnedVerifier.load(altered)
    (altered / CARD_FILE).write_text(json.dumps({"sha256": "0" * 64, "threshold": 0.5}))
    (altered / MODEL_FILE).unlink()
    with pytest.raises(VerifierError, match="is missing"):
        LearnedVerifier.load(altered)


@pytest.mark.parametrize(("kind", "question"), [
    ("negation", "How do I learn to cook rice?"),
    ("number", "Can I run 5 km in 20 minutes?"),
    ("antonym", "What is the best phone to buy?"),
    ("entity", "How do I move to Canada from India?"),
    ("class swap", "Why is the sky blue in the morning?"),
    ("direction", "How do I get from Paris to London?"),
    ("order swap", "Is Python faster than Java?"),
])
def test_each_kind_of_generated_negative_changes_the_question(kind: str, question: str
                                                              ) -> None:
    import random

    others = ["What is the best time to visit Japan?", "Is Berlin cheaper than Munich?"]
    edited = negatives.EDITS[kind](question, random.Random(0), others)
    assert edited is not None and edited.lower() != question.lower()


def test_names_are_traded_around_an_asymmetric_word_and_kept_around_a_symmetric_one(
        ) -> None:
    import random

    assert negatives.swap_order("Is Python faster than Java?", random.Random(0), []) == \
        "Is Java faster than Python?"
    assert negatives.swap_order("Which is better, Python or Java?", random.Random(0),
                                []) is None  # "or" asks the same either way ...
    assert negatives.symmetric_variant("Which is better, Python or Java?") == \
        "Which is better, Java or Python?"  # ... so the trade is a label-1 variant
    assert negatives.symmetric_variant("Is Python faster than Java?") is None


@pytest.mark.parametrize(("question", "either"), [
    ("How do I make coffee without sugar?", {"How do I make coffee with no sugar?",
                                             "How can I make coffee without sugar?",
                                             "How to make coffee without sugar?"}),
    ("Tell us about US politics", {"Tell us about United States politics"}),
    ("Tell us about the United States", {"Tell us about the US", "Tell us about the USA"}),
    ("AI is it dangerous?", {"Artificial intelligence is it dangerous?"}),
    ("Why can't I sleep?", {"Why cannot I sleep?"}),
])
def test_a_rewording_keeps_the_request_either_way_round(question: str, either: set[str]
                                                         ) -> None:
    """Every label-1 rewording made is one of the equivalences, applied in the right case;
    "us" is not "US"."""
    import random

    rng = random.Random(0)
    made = {negatives.reworded(question, rng) for _ in range(40)}
    assert made == either


def test_the_distance_either_way_round_is_the_same_question_never_a_negative() -> None:
    import random

    question = "What is the distance from Paris to London?"
    assert negatives.symmetric_direction(question) == \
        "What is the distance from London to Paris?"
    assert negatives.reverse_direction(question, random.Random(0), []) is None
    assert negatives.symmetric_direction("How do I get from Paris to London?") is None
    assert negatives.reverse_direction("How do I get from Paris to London?",
                                       random.Random(0), []) == \
        "How do I get from London to Paris?"


def test_generation_is_seeded_and_spreads_over_the_kinds() -> None:
    questions = ["How do I learn Python in 30 days?", "Is it safe to fly to Japan?",
                 "What is the best way to travel from Rome to Paris?",
                 "Why is the sea blue?", "What are the pros of Java?"] * 10
    first = negatives.generate(questions, 30, seed=3)
    assert first == negatives.generate(questions, 30, seed=3)
    assert len(first) == 30 and len({kind for *_, kind in first}) >= 4
    assert all(label == 0 and edited != q for q, edited, label, _ in first)


@given(st.lists(st.tuples(st.text(max_size=12), st.text(max_size=12), st.integers(0, 1)),
                max_size=300), st.integers(1, 9))
def test_training_batches_hold_every_example_once_in_either_order(
        examples: list[tuple[str, str, int]], size: int) -> None:
    import random

    from meancache.shared.verifier.train import batches

    made = batches(examples, size, random.Random(0))
    assert all(1 <= len(batch) <= size for batch in made)
    assert len(made) == -(-len(examples) // size)  # one short batch at most
    as_sets = Counter((frozenset((a, b)), y) for batch in made for a, b, y in batch)
    assert as_sets == Counter((frozenset((a, b)), y) for a, b, y in examples)
