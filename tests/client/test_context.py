"""Context-aware lookups: a follow-up is only served after a matching previous turn."""

from collections.abc import Callable
from itertools import permutations

import numpy as np
import pytest
from meancache.client.cache import CacheSettings, Context, Hit, Miss, SemanticCache
from meancache.client.cache.context import context_agrees
from meancache.shared.encoder import Encoder

CacheFactory = Callable[..., SemanticCache]
Conversation = dict[str, str]


def hit(result: Hit | Miss) -> Hit:
    """The result, asserted to be a hit."""
    assert isinstance(result, Hit), f"expected a hit, got {result}"
    return result


def fill(cache: SemanticCache, conversations: list[Conversation]) -> None:
    """Store each conversation: its main query as a first turn, then its follow-up."""
    for n, conv in enumerate(conversations):
        main = cache.insert(conv["Main Query"], conv["Main Query Response"],
                            context=Context(conversation_id=f"c{n}", turn=0))
        cache.insert(conv["Follow-Up Query"], conv["Follow Up Query Response"],
                     context=Context(conversation_id=f"c{n}", turn=1, prev_entry_id=main.id,
                                     prev_query=conv["Main Query"]))


@pytest.fixture(scope="module")
def distinct_mains(encoder: Encoder, conversations: list[Conversation]) -> list[Conversation]:
    """Five conversations whose main queries are unlike each other and whose follow-ups are
    unlike every other stored query (its own main query included), so that only context
    decides whether a follow-up is served."""
    mains = encoder.encode([c["Main Query"] for c in conversations])
    follows = encoder.encode([c["Follow-Up Query"] for c in conversations])
    chosen: list[int] = []
    for i in range(len(conversations)):
        rows = chosen + [i]
        main_sims = mains[rows] @ mains[rows].T
        follow_sims = follows[rows] @ np.vstack([mains[rows], follows[rows]]).T
        np.fill_diagonal(main_sims, 0)
        np.fill_diagonal(follow_sims[:, len(rows):], 0)
        if main_sims.max() < 0.6 and follow_sims.max() < 0.7:
            chosen.append(i)
        if len(chosen) == 5:
            return [conversations[i] for i in chosen]
    raise AssertionError("the sample holds fewer than five unrelated conversations")


def test_follow_up_is_served_after_the_same_main_query(
    make_cache: CacheFactory, distinct_mains: list[Conversation]
) -> None:
    cache = make_cache()
    fill(cache, distinct_mains)
    cache.close()
    cache = make_cache()  # the contexts are persisted with the entries
    for conv in distinct_mains:
        result = hit(cache.lookup(conv["Follow-Up Query"],
                                  Context(prev_query=conv["Main Query"], turn=1)))
        assert result.matched_query == conv["Follow-Up Query"]
        assert result.answer == conv["Follow Up Query Response"]


def test_follow_up_is_not_served_after_another_main_query(
    make_cache: CacheFactory, distinct_mains: list[Conversation]
) -> None:
    cache = make_cache()
    fill(cache, distinct_mains)
    for a, b in permutations(distinct_mains, 2):
        result = cache.lookup(a["Follow-Up Query"], Context(prev_query=b["Main Query"], turn=1))
        assert isinstance(result, Miss), (a["Follow-Up Query"], b["Main Query"])
        assert "another context" in result.reason
        assert result.best_similarity is not None and result.best_similarity > 0.99


def test_follow_up_is_not_served_as_a_first_turn(
    make_cache: CacheFactory, distinct_mains: list[Conversation]
) -> None:
    cache = make_cache()
    fill(cache, distinct_mains)
    for conv in distinct_mains:
        assert isinstance(cache.lookup(conv["Follow-Up Query"]), Miss)
        first_turn = Context(conversation_id="new", turn=0)
        assert isinstance(cache.lookup(conv["Follow-Up Query"], first_turn), Miss)


def test_first_turn_entry_is_served_anywhere(
    make_cache: CacheFactory, distinct_mains: list[Conversation]
) -> None:
    cache = make_cache()
    fill(cache, distinct_mains)
    for a, b in zip(distinct_mains, distinct_mains[1:] + distinct_mains[:1], strict=True):
        assert hit(cache.lookup(a["Main Query"])).answer == a["Main Query Response"]
        mid = cache.lookup(a["Main Query"], Context(prev_query=b["Follow-Up Query"], turn=3))
        assert hit(mid).answer == a["Main Query Response"]


def test_follow_up_is_served_after_a_paraphrased_main_query(make_cache: CacheFactory) -> None:
    cache = make_cache()
    cache.insert("What famous landmark can you find in Paris?", "The Eiffel Tower.",
                 context=Context(prev_query="What is the capital of France?"))
    result = cache.lookup("What famous landmark can you find in Paris?",
                          Context(prev_query="what is france's capital city?"))
    assert hit(result).answer == "The Eiffel Tower."


def test_without_context_awareness_follow_ups_cross_contexts(
    make_cache: CacheFactory, distinct_mains: list[Conversation]
) -> None:
    cache = make_cache(settings=CacheSettings(context_aware=False))
    fill(cache, distinct_mains)
    a, b = distinct_mains[0], distinct_mains[1]
    result = cache.lookup(a["Follow-Up Query"], Context(prev_query=b["Main Query"], turn=1))
    assert hit(result).answer == a["Follow Up Query Response"]
    assert hit(cache.lookup(a["Follow-Up Query"])).answer == a["Follow Up Query Response"]


def test_context_agrees_rules() -> None:
    x = np.array([1.0, 0.0], dtype=np.float16)
    y = np.array([0.6, 0.8], dtype=np.float32)
    assert context_agrees(None, None, 0.8)
    assert context_agrees(None, y, 0.8)
    assert not context_agrees(x, None, 0.8)
    assert context_agrees(x, x.astype(np.float32), 0.8)
    assert not context_agrees(x, y, 0.8)  # cosine 0.6
    assert context_agrees(x, y, 0.6)
