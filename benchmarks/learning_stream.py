"""The error bound the user sets, measured on streams (issue 37, part 3).

Streams, each replayed in a seeded order as a user meets it: a miss is answered by a
simulated upstream whose answer names the question's group, stored, and (when it had a
candidate) labelled by comparing the two answers; the learned decision
(``client.learning``) serves where its bound allows. Beside it, the static decision (the
cache as it ships, PCA off so both search the same space) on the same stream.

- ``qqp``: QQP dev questions, grouped by their duplicate pairs, with non-duplicate pairs'
  questions as near neighbours (the stream the choices were made on);
- ``arena``: Chatbot Arena first turns, each also asked once more in a paraphrase made by
  code (templates, contractions, case), never used for a choice; only distinct requests
  (``--distinct``: Arena's users often send the same one, and serving its twin's answer
  would be scored wrong);
- ``reworded`` (with ``--reworded FILE``): Arena and ShareGPT first turns, each also asked
  in a language model's rewording (``verifier make-paraphrases --judge``'s verdicts: the
  pairs both judges kept), never used for a choice nor trained on.
- ``sts`` (with ``--sts FOLDER``): statements nobody here wrote, the STS benchmark's
  free-text pairs (``_sts``), grouped by the pairs scored 4 or more, with the near-misses
  (scored 2-3) as near neighbours, as the QQP stream is made; never used for a choice.

Also measures the answer comparison (``agreement``) on answer pairs it generates: the
same answer re-worded against another question's answer.

    python benchmarks/learning_stream.py --questions 1200 --plot docs/learning_stream.png
    python benchmarks/learning_stream.py --questions 800 --streams qqp arena --draws 6
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from _common import base_parser, distinct_requests, load_encoder, note, print_table
from _plot import add_plot_option, line_chart
from _sts import labelled as sts_labelled
from _sts import read_sts
from meancache.client.cache import SemanticCache
from meancache.client.cache.settings import CacheSettings
from meancache.client.eval_stream import Tally, Turn, replay, stream_of
from meancache.client.learning.agreement import AGREE_AT, agree
from meancache.client.learning.bound import CONFIDENCE, labels_needed
from meancache.shared.encoder import profile_threshold
from meancache.shared.pairs import Pair
from meancache.shared.verifier.paraphrase import read_jsonl
from rich.table import Table
from scipy.stats import binom

OPENERS = ("Can you tell me: ", "Please answer this. ", "I was wondering, ", "Quick question: ",
           "Help me with this: ")
SWAPS = (("what is", "what's"), ("how do i", "how can i"), ("can you", "could you"),
         ("explain", "describe"), ("write", "compose"), ("give me", "provide"))


def paraphrase(text: str, rng: random.Random) -> str:
    """A code-made paraphrase: a swap of common phrasings, an opener, a changed case."""
    out = text.strip()
    for a, b in SWAPS:
        if a in out.lower():
            i = out.lower().index(a)
            out = out[:i] + b + out[i + len(a):]
            break
    if rng.random() < 0.6:
        out = rng.choice(OPENERS) + out[0].lower() + out[1:]
    if rng.random() < 0.3:
        out = out.lower().rstrip("?.!")
    return out


def qqp_stream(data: Path, questions: int, seed: int) -> list[Turn]:
    rows = [json.loads(line) for line in (data / "qqp" / "pairs.jsonl").open()]
    return labelled_stream([Pair(r["q1"], r["q2"], r["label"]) for r in rows
                            if r["split"] == "dev"], questions, seed)


def sts_stream(folder: Path, questions: int, seed: int) -> list[Turn]:
    return labelled_stream(sts_labelled(read_sts(folder)), questions, seed)


def labelled_stream(pairs: list[Pair], questions: int, seed: int) -> list[Turn]:
    """A seeded sample of labelled pairs as a stream: the pairs of one meaning (7 in 10),
    the others' questions as near neighbours (3 in 10)."""
    pairs = list(pairs)
    random.Random(seed).shuffle(pairs)
    same = [p for p in pairs if p.label == 1][: int(questions * 0.35)]
    others = [p for p in pairs if p.label == 0][: int(questions * 0.15)]
    return stream_of(same + others, seed)


def arena_stream(data: Path, questions: int, seed: int, encoder, cache_dir: Path,
                 distinct: float) -> list[Turn]:
    """Chatbot Arena first turns, each once and once in a code-made paraphrase; only
    distinct requests (``distinct_requests`` at ``distinct``; 1 keeps all): a first turn
    nearly identical to another would be scored wrong where it is served the other's
    answer, which is right."""
    rows = [json.loads(line)["text"] for line in
            (data / "instructions" / "arena_first_turns.jsonl").open()]
    rng = random.Random(seed)
    rows = distinct_requests([r for r in rows if 3 <= len(r.split()) <= 40], encoder,
                             cache_dir, distinct)
    rng.shuffle(rows)
    pairs = [Pair(r, paraphrase(r, rng), 1) for r in rows[: questions // 2]]
    return stream_of(pairs, seed)


def reworded_stream(path: Path, questions: int, seed: int) -> list[Turn]:
    """The kept pairs of a judged paraphrase file, each pair's two texts one group."""
    rows = read_jsonl(path)
    if not rows or "kept" not in rows[0]:
        raise SystemExit(f"{path} holds no verdicts: pass the .judged.jsonl that "
                         "`meancache verifier make-paraphrases --judge` writes")
    pairs = [Pair(r["source"], r["paraphrase"], 1) for r in rows if r["kept"]]
    return stream_of(pairs[: questions // 2], seed)


def agreement_accuracy(encoder, seed: int, n: int = 400) -> dict[float, float]:
    """Accuracy of ``agree`` on generated answer pairs: a long answer against a re-worded
    copy (agree) and against another answer (disagree); short answers exactly."""
    rng = random.Random(seed)
    topics = ["boiling water", "the capital of France", "sorting a list in Python",
              "photosynthesis", "the French Revolution", "compound interest", "TCP handshakes",
              "the speed of light", "making bread", "black holes", "vaccines", "git rebase"]
    def long(topic: str, variant: int) -> str:
        forms = [f"In short, {topic} works like this: the main idea is explained step by step, "
                 f"with an example about {topic} at the end.",
                 f"Here is how {topic} works. The main idea comes first, explained step by "
                 f"step, then an example of {topic}.",
                 f"{topic.capitalize()}: the key idea, step by step, and an example to finish."]
        return forms[variant % len(forms)]
    shorts = ["100°C", "212°F", "Paris", "Lyon", "42", "43", "yes", "no"]
    memo: dict[str, np.ndarray] = {}

    def encode(texts: Sequence[str]) -> np.ndarray:  # few distinct answers: embed each once
        for text in texts:
            if text not in memo:
                memo[text] = encoder.encode([text])[0]
        return np.stack([memo[text] for text in texts])
    cases = []
    for _ in range(n):
        same = rng.random() < 0.5
        if rng.random() < 0.25:
            a = rng.choice(shorts)
            b = a if same else rng.choice([s for s in shorts if s != a])
        else:
            t = rng.choice(topics)
            a = long(t, rng.randrange(3))
            b = long(t, rng.randrange(3)) if same else \
                long(rng.choice([x for x in topics if x != t]), rng.randrange(3))
        cases.append((a, b, same))
    return {at: sum(agree(a, b, encode, at) == same for a, b, same in cases) / n
            for at in (0.7, 0.75, 0.8, 0.85, AGREE_AT, 0.95)}


def row(table: Table, name: str, tally: Tally, seconds: float) -> dict:
    report = tally.report()
    w, h = report["whole"], report["last_half"]
    table.add_row(name, str(w["right"]), str(w["wrong"]), str(w["miss"]),
                  f"{w['hit_precision']:.1%}", f"{w['wrong_rate']:.2%}", f"{w['hit_rate']:.1%}",
                  f"{h['wrong_rate']:.2%}", f"{h['hit_rate']:.1%}", f"{h['ceiling']:.1%}",
                  f"{report['answerable_hit_rate']:.1%}", str(report["upstream_calls"]),
                  str(report["explored"]), f"{seconds:.0f}")
    return report


def rolling(outcomes: list[str], window: int) -> tuple[list[float], list[float], list[float]]:
    xs, wrong, hit = [], [], []
    for end in range(window, len(outcomes) + 1, max(1, window // 4)):
        part = outcomes[end - window:end]
        s = Tally.summary(part)
        xs.append(end)
        wrong.append(100 * s["wrong_rate"])
        hit.append(100 * s["hit_rate"])
    return xs, wrong, hit


def replayed(turns: list[Turn], encoder, settings: CacheSettings, seed: int,
             learns: bool = True, name: str = "") -> Tally:
    """The stream replayed through the product's cache in a temporary directory (a seeded
    draw for exploration where it learns); with a ``name``, what it learned is noted."""
    with tempfile.TemporaryDirectory() as directory, \
            SemanticCache(Path(directory), encoder, settings, learns=learns,
                          rng=random.Random(seed) if learns else None) as cache:
        tally = replay(cache, turns)
        b, learned = cache.learned.bound, cache.learned
        if learns and name:
            note(f"{name}: final threshold {b.threshold:.3f} (learned={b.learned}), estimated "
                 f"wrong {b.estimate}, upper {b.upper}, {b.labels} labels over it, "
                 f"{len(learned.labels)} labels in all ({labels_needed(settings.max_wrong_rate)}"
                 f" needed, none wrong, before any region can pass), {learned.aliases} aliases")
        return tally


def run(name: str, turns: list[Turn], encoder, settings: CacheSettings, table: Table,
        seed: int, learns: bool = True) -> Tally:
    """One decision on the stream, a row of ``table``."""
    started = time.perf_counter()
    tally = replayed(turns, encoder, settings, seed, learns, name)
    row(table, name, tally, time.perf_counter() - started)
    return tally


def stream(name: str, args: argparse.Namespace, seed: int, encoder) -> list[Turn]:
    """The stream ``name`` drawn and ordered with ``seed``."""
    if name == "reworded":
        return reworded_stream(args.reworded, args.questions, seed)
    if name == "sts":
        return sts_stream(args.sts, args.questions, seed)
    if name == "arena":
        return arena_stream(args.data_dir, args.questions, seed, encoder, args.cache_dir,
                            args.distinct)
    return qqp_stream(args.data_dir, args.questions, seed)


def chance_of_as_many_wrong(wrong: int, served: int, rate: float) -> float:
    """The chance that answers each wrong at ``rate`` give at least ``wrong`` wrong of
    ``served`` (binomial): under 1 - confidence, the draw refutes the bound."""
    return float(binom.sf(wrong - 1, served, rate)) if wrong else 1.0


def draws(name: str, args: argparse.Namespace, encoder, settings: CacheSettings,
          static: Tally, learned: Tally) -> None:
    """The stream ``name`` in ``args.draws`` draws (the first: the one just replayed): the
    static and the learned decision on each, and whether the learned one's wrong answers
    refute the bound there. One draw is one stream: how the bound fares on streams like it
    is read over the draws."""
    table = Table(title=f"{name} stream in {args.draws} draws ({args.questions} questions "
                  f"each, max_wrong_rate {args.max_wrong_rate} at {CONFIDENCE:.0%})")
    for column in ("seed", "static right / wrong", "learned right / wrong",
                   "learned wrong rate", "last-half hit rate (static, learned)",
                   "chance of as many wrong", "refuted"):
        table.add_column(column)
    refuted = 0
    for seed in range(args.seed, args.seed + args.draws):
        if seed != args.seed:
            turns = stream(name, args, seed, encoder)
            static = replayed(turns, encoder, settings, seed, learns=False)
            learned = replayed(turns, encoder, settings, seed)
        s, w = static.report(), learned.report()
        chance = chance_of_as_many_wrong(learned.wrong, learned.right + learned.wrong,
                                         args.max_wrong_rate)
        refuted += chance < 1 - CONFIDENCE
        table.add_row(str(seed), f"{static.right} / {static.wrong}",
                      f"{learned.right} / {learned.wrong}",
                      f"{w['whole']['wrong_rate']:.2%}",
                      f"{s['last_half']['hit_rate']:.1%}, {w['last_half']['hit_rate']:.1%}",
                      f"{chance:.3f}", "yes" if chance < 1 - CONFIDENCE else "no")
    print_table(table)
    note(f"{name}: the bound refuted at {CONFIDENCE:.0%} on {refuted} of {args.draws} draws "
         f"(a bound that holds is refuted on at most {1 - CONFIDENCE:.0%} of them)")


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--encoder", default="mpnet", help="encoder profile (the product's: "
                        "MPNet, which the decision card was fitted with; minilm: fast)")
    parser.add_argument("--questions", type=int, default=3000, help="questions per stream")
    parser.add_argument("--max-wrong-rate", type=float, default=0.02)
    parser.add_argument("--explore", type=float,
                        help="exploration rate (default: the judge's own, as explore_rate)")
    parser.add_argument("--explore-width", type=float, help="how far above the threshold a "
                        "would-be hit counts as near (default: the judge's own)")
    parser.add_argument("--explore-beyond", type=float, help="the share of would-be hits "
                        "above the near band also explored (default: the judge's own, as "
                        "explore_beyond_rate)")
    parser.add_argument("--explore-warmup", type=int, help="own labels over the threshold "
                        "before any would-be hit is served (default: explore_warmup's)")
    parser.add_argument("--streams", nargs="+", default=["qqp", "arena"],
                        choices=["qqp", "arena", "reworded", "sts"])
    parser.add_argument("--distinct", type=float, default=0.9,
                        help="the Arena stream keeps a first turn only if its cosine to every "
                        "one kept before is under this (1: every one)")
    parser.add_argument("--reworded", type=Path, help="the judged pairs the reworded stream "
                        "is made of (make-paraphrases --judge's .judged.jsonl)")
    parser.add_argument("--sts", type=Path, help="the STS benchmark's csv folder the sts "
                        "stream is made of (benchmarks/_sts.py)")
    parser.add_argument("--draws", type=int, default=1,
                        help="replay each stream this many times in all, the others drawn and "
                        "ordered with the seeds after --seed, and print per draw the chance "
                        "of as many wrong answers as the learned decision served at a true "
                        "max_wrong_rate (under 5%%: that draw refutes the bound at 95%%)")
    parser.add_argument("--explore-until-learned", choices=("true", "false"),
                        default="true", help="explore every near would-be hit until labels "
                        "of traffic settle the threshold (explore_until_learned; false: "
                        "explore_rate of them once the warm-up is done)")
    parser.add_argument("--near-only", action="store_true",
                        help="also the learned decision exploring only explore_rate of the near "
                        "would-be hits from the start (explore_until_learned false: not "
                        "every one until labels of traffic settle the threshold)")
    parser.add_argument("--variants", action="store_true",
                        help="also the rules decision (the ambiguity rule and every word rule: "
                        "decision = 'rules') and the cosine alone (verify_hits off), each "
                        "learning (the measurement that decides whether they stay)")
    parser.add_argument("--verifier-off", action="store_true",
                        help="also, on every stream, the cache with the learned verifier off "
                        "(verify_hits false): tau alone, learning nothing, against the bound "
                        "learned on the cosine")
    add_plot_option(parser)
    args = parser.parse_args()
    encoder = load_encoder("onnx", args.cache_dir, model=args.encoder)
    sweep = agreement_accuracy(encoder, args.seed)
    note("answer agreement on 400 generated answer pairs (exact for short answers), "
         "accuracy by cosine threshold: "
         + ", ".join(f"{at}: {accuracy:.1%}" for at, accuracy in sweep.items()))
    # The encoder's own tau, as the app's config sets it (CacheSettings alone holds MiniLM's).
    settings = CacheSettings(pca_dims=0, global_threshold=profile_threshold(args.encoder),
                             max_wrong_rate=args.max_wrong_rate,
                             explore_rate=args.explore,
                             explore_width=args.explore_width,
                             explore_beyond_rate=args.explore_beyond,
                             explore_warmup=args.explore_warmup,
                             explore_until_learned=args.explore_until_learned == "true")
    if "reworded" in args.streams and args.reworded is None:
        parser.error("the reworded stream needs --reworded FILE")
    if "sts" in args.streams and args.sts is None:
        parser.error("the sts stream needs --sts FOLDER")
    if args.draws < 1:
        parser.error("--draws must be at least 1")
    lines: dict[str, tuple[list[float], list[float]]] = {}
    for name in args.streams:
        turns = stream(name, args, args.seed, encoder)
        note(f"stream {name}: {len(turns)} questions, {len({t.group for t in turns})} groups, "
             f"order seed {args.seed}")
        table = Table(title=f"{name} stream ({len(turns)} questions, seed {args.seed}, "
                      f"{args.encoder}, max_wrong_rate {args.max_wrong_rate}, decision "
                      f"{settings.decision})")
        for column in ("decision", "right", "wrong", "miss", "hit precision", "wrong rate",
                       "hit rate", "last-half wrong", "last-half hit rate",
                       "last-half at most", "answerable hit rate", "upstream calls",
                       "explored", "s"):
            table.add_column(column)
        static = run("static (shipped decision, learning nothing)", turns, encoder, settings,
                     table, args.seed, learns=False)
        learned = run("learned (shipped decision + the bound, aliases, exploration)", turns,
                      encoder, settings, table, args.seed)
        if args.near_only:
            run("learned, exploring explore_rate of near hits from the start", turns, encoder,
                settings.model_copy(update={"explore_until_learned": False}), table, args.seed)
        if args.variants and name == "qqp":  # the choices are made on qqp only
            run("learned, rules decision", turns, encoder,
                settings.model_copy(update={"decision": "rules"}), table, args.seed)
            run("learned, cosine alone", turns, encoder,
                settings.model_copy(update={"verify_hits": False}), table, args.seed)
        if args.verifier_off:
            off = settings.model_copy(update={"verify_hits": False})
            run("verifier off: tau alone, learning nothing", turns, encoder, off, table,
                args.seed, learns=False)
            run("verifier off: the bound learned on the cosine", turns, encoder, off, table,
                args.seed)
        for label, tally in (("static", static), ("learned", learned)):
            xs, wrong, hit = rolling(tally.outcomes, 300)
            lines[f"{name}: {label} wrong %"] = (xs, wrong)
            lines[f"{name}: {label} hit %"] = (xs, hit)
        print_table(table)
        if args.draws > 1:
            draws(name, args, encoder, settings, static, learned)
    if args.plot:
        line_chart(args.plot, "Wrong rate and hit rate along the stream (300-question window)",
                   "questions asked", "%", lines,
                   subtitle=f"{args.encoder}, max_wrong_rate {args.max_wrong_rate}, "
                   f"exploration {args.explore or 'the judge’s own'}")


if __name__ == "__main__":
    main()
