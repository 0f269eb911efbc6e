"""When may an entry asked in one conversational context answer a query in another?

MeanCache links each entry to the turn before it. Here an entry keeps the previous turn's
question (and its embedding), and a candidate similar enough to the query is accepted only
when their contexts agree. The rule is structural (what each question was asked after),
never a reading of the question's words:

- both first turns: they agree (nothing came before either);
- entry asked as a follow-up, query is a first turn: refused (e.g. "What are its types?"
  cached after "What is inflation?" must not answer a fresh "What are its types?");
- both follow-ups: the previous questions must themselves match (cosine >= tau);
- entry asked as a first turn, query is a follow-up: the entry's answer never saw a
  conversation, and whether the query stands on its own cannot be known from one question
  ("What about Germany?" asked first is not the same question after "What is the capital
  of France?"). So it is served only when the query's previous question matches the
  entry's own question (cosine >= tau): the conversation was already on that question (a
  repeat, or a rephrasing of it), so the context adds nothing the entry did not have.

An entry whose hit was rejected at a similarity of ``SAME`` or more in another context
was the same question with a different meaning: the context, not tau, was wrong. Such an
entry is *bound* to its own context: it answers only where the previous question is the
same (first turn for a first-turn entry, a previous question at ``SAME`` or more for a
follow-up).

Precision over recall, as beta = 0.5 says: a self-contained question asked mid-conversation
misses a first-turn entry and is asked upstream (then stored, as a follow-up).
"""

import numpy as np

SAME = 0.99  # cosine at which two questions are the same question (wording aside)


def similar(a: np.ndarray, b: np.ndarray) -> float:
    return float(a.astype(np.float32) @ b.astype(np.float32))


def context_agrees(entry_context: np.ndarray | None, query_context: np.ndarray | None,
                   threshold: float, entry_query: np.ndarray, bound: bool = False) -> bool:
    """``entry_query``: the entry's own question vector; ``bound``: the entry answers only
    in its own context (see the module's docstring)."""
    need = SAME if bound else threshold
    if entry_context is None:
        if query_context is None:
            return True
        return not bound and similar(entry_query, query_context) >= threshold
    if query_context is None:
        return False
    return similar(entry_context, query_context) >= need


def same_context(entry_context: np.ndarray | None, query_context: np.ndarray | None) -> bool:
    """Whether a query was asked after the same question as the entry (or both first)."""
    if entry_context is None or query_context is None:
        return entry_context is None and query_context is None
    return similar(entry_context, query_context) >= SAME
