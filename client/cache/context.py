"""When may an entry asked in one conversational context answer a query in another?

MeanCache links each entry to the turn before it. Here an entry keeps the previous turn's
query (and its embedding), and a candidate that is similar enough to the query is
accepted only when its context agrees with the query's:

- entry asked as a first turn (no context): its answer did not depend on a conversation,
  so it may answer the query in any context;
- entry asked as a follow-up, query is a first turn: refused (e.g. "What are its types?"
  cached after "What is inflation?" must not answer a fresh "What are its types?");
- both follow-ups: the previous queries must themselves match (cosine >= tau).

The rule is conservative: a self-contained question asked mid-conversation is stored as a
follow-up and is reused only after a similar previous turn. Precision over recall, as
beta = 0.5 says.
"""

import numpy as np


def context_agrees(
    entry_context: np.ndarray | None, query_context: np.ndarray | None, threshold: float
) -> bool:
    if entry_context is None:
        return True
    if query_context is None:
        return False
    return float(entry_context.astype(np.float32) @ query_context.astype(np.float32)) >= threshold
