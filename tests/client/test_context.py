"""Context-aware lookups: a follow-up is only served after a matching previous turn."""

from collections.abc import Callable
from itertools import permutations

import numpy as np
import pytest
from meancache.client.cache import CacheSettings, Context, Hit, Miss, SemanticCache
from meancache.client.cache.context import SAME, context_agrees
from meancache.client.matching.labels import labelled_pairs
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


def test_first_turn_entry_is_served_in_a_conversation_only_after_its_own_question(
    make_cache: CacheFactory, distinct_mains: list[Conversation]
) -> None:
    """A first-turn entry answers any first turn; inside a conversation only when the
    previous question was that question (a repeat), never after an unrelated one: whether
    the question stands on its own is not known from the question."""
    cache = make_cache()
    fill(cache, distinct_mains)
    for a, b in zip(distinct_mains, distinct_mains[1:] + distinct_mains[:1], strict=True):
        assert hit(cache.lookup(a["Main Query"])).answer == a["Main Query Response"]
        mid = cache.lookup(a["Main Query"], Context(prev_query=b["Follow-Up Query"], turn=3))
        assert isinstance(mid, Miss)
        again = cache.lookup(a["Main Query"], Context(prev_query=a["Main Query"], turn=1))
        assert hit(again).answer == a["Main Query Response"]


def test_a_first_turn_follow_up_in_form_does_not_answer_it_inside_a_conversation(
    make_cache: CacheFactory
) -> None:
    """The issue's scenario: "What about Germany?" asked first is stored as a first turn;
    asked after "What is the capital of France?" it means something else."""
    cache = make_cache()
    cache.insert("What about Germany?", "Germany is a country in the European Union.",
                 context=Context(conversation_id="a", turn=0))
    after_france = Context(conversation_id="b", turn=1,
                           prev_query="What is the capital of France?")
    result = cache.lookup("What about Germany?", after_france)
    assert isinstance(result, Miss)
    assert result.best_similarity is not None and result.best_similarity >= 0.99
    assert hit(cache.lookup("What about Germany?", Context(conversation_id="c"))).answer \
        .startswith("Germany is a country")


def test_rejecting_the_same_question_in_another_context_teaches_the_context_not_tau(
    make_cache: CacheFactory
) -> None:
    question = "How do I reverse a list in Python?"
    cache = make_cache(settings=CacheSettings(tune_min_per_class=1))
    cache.insert(question, "Use reversed() or list.reverse().",
                 context=Context(conversation_id="a", turn=0))
    repeat = Context(conversation_id="b", turn=1, prev_query=question)
    served = hit(cache.lookup(question, repeat))  # a repeat in a conversation: served
    assert served.similarity >= SAME
    tau = cache.threshold
    change = cache.reject(question, served.origin, repeat)
    assert not change.changed and change.new == tau == cache.threshold
    assert labelled_pairs(cache.store) == []  # nothing for tau or FL to learn from
    assert cache.stats().rejections == 1
    assert isinstance(cache.lookup(question, repeat), Miss)  # bound to its own context
    assert hit(cache.lookup(question)).answer.startswith("Use reversed()")  # a first turn
    cache.close()
    reopened = make_cache()
    assert isinstance(reopened.lookup(question, repeat), Miss)  # the lesson is persisted
    # the same rejection again records nothing more
    assert not reopened.reject(question, served.origin, repeat).changed
    assert reopened.stats().rejections == 1


def test_rejecting_a_hit_in_its_own_context_still_re_tunes_tau(make_cache: CacheFactory
                                                                 ) -> None:
    cache = make_cache(settings=CacheSettings(tune_min_per_class=1))
    cache.insert("What is the capital of France?", "Paris.")
    served = hit(cache.lookup("What's the capital of France?"))
    cache.reject("What's the capital of France?", served.origin, Context())
    assert [pair.label for pair in labelled_pairs(cache.store)] == [0]


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
    q = np.array([0.0, 1.0], dtype=np.float32)  # the entry's own question
    assert context_agrees(None, None, 0.8, q)
    assert not context_agrees(None, y, 0.9, q)  # first-turn entry, unrelated previous turn
    assert context_agrees(None, y, 0.8, q)  # the previous question was the entry's (0.8)
    assert not context_agrees(None, y, 0.8, q, bound=True)
    assert context_agrees(None, None, 0.8, q, bound=True)
    assert not context_agrees(x, None, 0.8, q)
    assert context_agrees(x, x.astype(np.float32), 0.8, q)
    assert context_agrees(x, x.astype(np.float32), 0.8, q, bound=True)
    assert not context_agrees(x, y, 0.8, q)  # cosine 0.6
    assert context_agrees(x, y, 0.6, q)
    assert not context_agrees(x, y, 0.6, q, bound=True)
