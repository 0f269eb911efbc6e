"""`meancache cache demo`: the cache end to end on a few questions, in a scratch directory."""

from meancache.client.cache import Context, Hit, SemanticCache
from rich.console import Console
from rich.table import Table

ANSWERS = {
    "What is the capital of France?": "Paris is the capital of France.",
    "How do I reverse a list in Python?": "Use my_list.reverse() or reversed(my_list).",
    "What is photosynthesis?": "Plants turning light, water and CO2 into sugar and oxygen.",
}
FOLLOW_UP = ("What famous landmark can you find there?", "The Eiffel Tower.")

PROBES: list[tuple[str, str | None, str]] = [
    ("What is the capital of France?", None, "the same question"),
    ("What is France's capital?", None, "a paraphrase"),
    ("How can I reverse a Python list?", None, "a paraphrase"),
    ("Who won the football world cup in 2018?", None, "an unrelated question"),
    (FOLLOW_UP[0], "What is the capital of France?", "follow-up, same context"),
    (FOLLOW_UP[0], "What is the capital of Italy?", "follow-up, other context"),
]


def run_demo(cache: SemanticCache, console: Console) -> None:
    cache.clear()
    ids = {}
    for question, answer in ANSWERS.items():
        ids[question] = cache.insert(question, answer).id
    main = "What is the capital of France?"
    cache.insert(FOLLOW_UP[0], FOLLOW_UP[1],
                 context=Context("demo", 1, ids[main], main))
    console.print(f"Cached {len(cache)} answers; threshold tau = {cache.threshold:.3f}\n")
    table = Table("asked", "case", "result", "similarity", "answer")
    for question, previous, case in PROBES:
        context = Context("probe", 1, None, previous) if previous else None
        result = cache.lookup(question, context)
        if isinstance(result, Hit):
            table.add_row(question, case, "[green]hit[/]", f"{result.similarity:.3f}",
                          result.answer)
        else:
            similarity = "-" if result.best_similarity is None else f"{result.best_similarity:.3f}"
            table.add_row(question, case, "[yellow]miss[/]", similarity, result.reason)
    console.print(table)
    stats = cache.stats()
    console.print(
        f"\nhits {stats.hits}, misses {stats.misses}, entries {stats.entries}, "
        f"encoder {stats.encoder_version} on {stats.encoder_backend}, "
        f"{stats.bytes_per_embedding} bytes per stored embedding"
    )
