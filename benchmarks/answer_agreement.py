"""The answer comparison (``client.learning.agreement``) measured on the embedded
upstream's real answers (issue 37): how often it says "agree" for two questions that are
the same and for two that are not, by answer-encoder threshold.

The cache labels a declined or explored candidate by comparing the upstream's fresh
answer to the question with the answer the candidate holds, on the premise that at
temperature 0 the same question gets the same answer. Here both questions of a pair with
known truth are answered by the embedded upstream (Gemma 3 270M by default, in the
upstream's default precision ``auto``, greedy, up to --max-tokens tokens, one user
turn), and ``agree`` compares the two answers:

- same question: QQP dev duplicates; different: QQP dev non-duplicates; both only in
  the band where the cache labels (question cosine from the recall tau, 0.776, under
  the device's encoder, MPNet on onnx-int8), where candidates are declined or explored;
- optionally (--arena N) Arena first turns against a code-made paraphrase
  (``learning_stream.paraphrase``), same question.

Each pair goes to the choose or the test half by a hash of its two questions; the
threshold is chosen on the choose half (the most accurate; a tie goes to the higher,
which makes fewer false "agree", the error that hides a wrong hit) and the test half is
reported beside it. Answers are generated once and kept under --cache-dir (answers/),
so a rerun or a larger --pairs only generates what is new.

    python benchmarks/answer_agreement.py --plot docs/answer_agreement.png
    python benchmarks/answer_agreement.py --quick          # tiny-gemma3, 6+6 pairs
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _common import (
    apply_defaults,
    base_parser,
    embed_cached,
    heading,
    load_encoder,
    load_qqp,
    machine_load,
    make_table,
    note,
    pct,
    print_command,
    print_table,
)
from _plot import add_plot_option, line_chart
from meancache.client.learning.agreement import AGREE_AT, agree, is_short, normalised
from meancache.shared.jsonl import jsonl_lines

BAND_FROM = 0.776  # shared.verifier.mine.RECALL_TAU: MPNet's tau less the recall margin
THRESHOLDS = tuple(round(0.6 + 0.05 * i, 2) for i in range(8))  # 0.6 .. 0.95
ENCODERS = ("mpnet", "minilm")


@dataclass(frozen=True)
class QuestionPair:
    q1: str
    q2: str
    same: bool
    source: str  # "qqp" or "arena"

    @property
    def half(self) -> str:
        """"choose" or "test", from a hash of the pair itself (stable across runs/sizes)."""
        digest = hashlib.sha256(f"{self.q1}\0{self.q2}".encode()).digest()
        return "choose" if digest[0] % 2 == 0 else "test"


def qqp_pairs(data_dir: Path, cache_dir: Path, n: int, seed: int) -> list[QuestionPair]:
    """n duplicates and n non-duplicates of QQP dev whose question cosine under the
    device's encoder is in the band; drawn in a seeded order, a few times n embedded."""
    dev = load_qqp(data_dir, "dev")
    random.Random(seed).shuffle(dev)
    encoder = load_encoder("onnx-int8", cache_dir, model="mpnet")
    out: list[QuestionPair] = []
    for label in (1, 0):
        rows = [p for p in dev if p.label == label][: n * (2 if label else 5)]
        a = embed_cached(encoder, [p.q1 for p in rows], cache_dir)
        b = embed_cached(encoder, [p.q2 for p in rows], cache_dir)
        cosines = np.einsum("ij,ij->i", a, b)
        kept = [QuestionPair(p.q1, p.q2, bool(label), "qqp")
                for p, c in zip(rows, cosines, strict=True) if c >= BAND_FROM][:n]
        note(f"QQP dev {'duplicates' if label else 'non-duplicates'}: {len(kept)} of "
             f"{len(rows)} drawn are in the band (question cosine >= {BAND_FROM})")
        out += kept
    return out


def arena_pairs(data_dir: Path, n: int, seed: int) -> list[QuestionPair]:
    from learning_stream import paraphrase

    rng = random.Random(seed)
    with (data_dir / "instructions" / "arena_first_turns.jsonl").open(encoding="utf-8") as fh:
        rows = [json.loads(line)["text"] for line in fh]
    rows = [r for r in rows if 3 <= len(r.split()) <= 30]
    rng.shuffle(rows)
    return [QuestionPair(r, paraphrase(r, rng), True, "arena") for r in rows[:n]]


class Answers:
    """The upstream's greedy answers, kept in a JSONL file per model, precision and length
    cap, so that only questions not answered before are generated."""

    def __init__(self, model: str, precision: str, max_tokens: int, cache_dir: Path) -> None:
        self.model, self.precision, self.max_tokens = model, precision, max_tokens
        self.cache_dir = cache_dir
        name = f"{model.replace(':', '-').replace('/', '-')}-{precision}-{max_tokens}.jsonl"
        self.path = cache_dir / "answers" / name
        self.known: dict[str, str] = {}
        if self.path.is_file():
            for _, line in jsonl_lines(self.path.read_text(encoding="utf-8")):
                row = json.loads(line)
                self.known[row["q"]] = row["a"]
        self._engine = None

    def _generate(self, question: str) -> str:
        from meancache.upstream.prompt_cache.engine import Delta
        from meancache.upstream.sampling import SamplingParams

        if self._engine is None:
            from meancache.upstream.model_loading import load_model
            from meancache.upstream.prompt_cache.engine import PromptCacheEngine

            note(f"loading {self.model} ({self.precision}) ...")
            loaded = load_model(self.model, device="cpu", data_dir=self.cache_dir,
                                precision=self.precision)
            note(f"  serving in {loaded.precision}")
            self._engine = PromptCacheEngine(loaded)
        prepared = self._engine.prepare_messages([{"role": "user", "content": question}])
        params = SamplingParams(max_tokens=self.max_tokens, temperature=0.0)
        return "".join(e.text for e in self._engine.generate(prepared, params)
                       if isinstance(e, Delta)).strip()

    def of(self, questions: Sequence[str]) -> dict[str, str]:
        todo = [q for q in dict.fromkeys(questions) if q not in self.known]
        if todo:
            note(f"generating {len(todo)} answers (up to {self.max_tokens} tokens each) ...")
        started = time.perf_counter()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            for i, question in enumerate(todo, 1):
                self.known[question] = self._generate(question)
                fh.write(json.dumps({"q": question, "a": self.known[question]}) + "\n")
                fh.flush()  # an interrupted run keeps what it generated
                if i % 10 == 0:
                    note(f"  {i}/{len(todo)} in {time.perf_counter() - started:.0f} s")
        return {q: self.known[q] for q in questions}


@dataclass(frozen=True)
class Rates:
    accuracy: float
    agree_same: float | None  # share of same-question pairs called "agree"
    agree_different: float | None
    n_same: int
    n_different: int


def rates(calls: Sequence[bool], pairs: Sequence[QuestionPair]) -> Rates:
    same = [c for c, p in zip(calls, pairs, strict=True) if p.same]
    different = [c for c, p in zip(calls, pairs, strict=True) if not p.same]
    right = sum(same) + sum(not c for c in different)
    return Rates(right / max(len(pairs), 1),
                 sum(same) / len(same) if same else None,
                 sum(different) / len(different) if different else None,
                 len(same), len(different))


def sweep(pairs: Sequence[QuestionPair], answers: dict[str, str], vectors: dict[str, np.ndarray]
          ) -> dict[float, list[bool]]:
    """``agree`` of each pair's two answers at each threshold."""
    def embed(texts: Sequence[str]) -> np.ndarray:
        return np.stack([vectors[t] for t in texts])
    return {at: [agree(answers[p.q1], answers[p.q2], embed, at) for p in pairs]
            for at in THRESHOLDS}


def choose(by_threshold: dict[float, Rates]) -> float:
    """The most accurate threshold; a tie goes to the higher one (fewer false agrees)."""
    return max(by_threshold, key=lambda at: (round(by_threshold[at].accuracy, 9), at))


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", help="the upstream (default builtin:gemma-3-270m; "
                        "--quick: builtin:tiny-gemma3)")
    parser.add_argument("--precision", default="auto",
                        help="the upstream's precision (the default upstream's: auto)")
    parser.add_argument("--pairs", type=int, help="QQP dev pairs of each kind (same, "
                        "different) in the band (default 60; --quick: 6)")
    parser.add_argument("--arena", type=int, default=0,
                        help="also this many Arena questions against a code-made paraphrase")
    parser.add_argument("--max-tokens", type=int, default=64, help="answer length cap")
    parser.add_argument("--encoders", nargs="+", default=list(ENCODERS),
                        help="answer encoders (profiles), each on --backend")
    parser.add_argument("--backend", default="onnx-int8",
                        help="the answer encoders' backend (the device's default: onnx-int8)")
    add_plot_option(parser)
    args = apply_defaults(parser.parse_args(),
                          {"model": "builtin:gemma-3-270m", "pairs": 60},
                          {"model": "builtin:tiny-gemma3", "pairs": 6})
    load_before = machine_load()
    pairs = qqp_pairs(args.data_dir, args.cache_dir, args.pairs, args.seed)
    if args.arena:
        pairs += arena_pairs(args.data_dir, args.arena, args.seed)
    store = Answers(args.model, args.precision, args.max_tokens, args.cache_dir)
    answers = store.of([q for p in pairs for q in (p.q1, p.q2)])
    texts = sorted(set(answers.values()))

    identical = [normalised(answers[p.q1]) == normalised(answers[p.q2]) for p in pairs]
    short = [is_short(answers[p.q1]) or is_short(answers[p.q2]) for p in pairs]
    halves = {h: [i for i, p in enumerate(pairs) if p.half == h] for h in ("choose", "test")}
    heading(f"Answer agreement on {args.model} ({args.precision}) answers, greedy, up to "
            f"{args.max_tokens} tokens: {sum(p.same for p in pairs)} same-question pairs "
            f"({sum(p.same and p.source == 'arena' for p in pairs)} Arena + paraphrase), "
            f"{sum(not p.same for p in pairs)} different (QQP dev, question cosine >= "
            f"{BAND_FROM}); choose half {len(halves['choose'])}, test half "
            f"{len(halves['test'])}")
    kinds = make_table(["pairs", "n", "identical answers", "a short answer (exact match only)"])
    for name, keep in (("same question, QQP", lambda p: p.same and p.source == "qqp"),
                       ("same question, Arena + paraphrase",
                        lambda p: p.same and p.source == "arena"),
                       ("different question, QQP", lambda p: not p.same)):
        chosen = [i for i, p in enumerate(pairs) if keep(p)]
        if chosen:
            kinds.add_row(name, str(len(chosen)), pct(np.mean([identical[i] for i in chosen])),
                          pct(np.mean([short[i] for i in chosen])))
    print_table(kinds)

    table = make_table(["encoder", "threshold", "choose: accuracy", "agree | same",
                        "agree | different", "test: accuracy", "agree | same",
                        "agree | different"])
    lines: dict[str, tuple[list[float], list[float]]] = {}
    for profile in args.encoders:
        encoder = load_encoder(args.backend, args.cache_dir, model=profile)
        vectors = dict(zip(texts, embed_cached(encoder, texts, args.cache_dir), strict=True))
        calls = sweep(pairs, answers, vectors)
        by_half = {h: {at: rates([calls[at][i] for i in idx], [pairs[i] for i in idx])
                       for at in THRESHOLDS} for h, idx in halves.items()}
        best = choose(by_half["choose"])
        for at in THRESHOLDS:
            c, t = by_half["choose"][at], by_half["test"][at]
            mark = " (chosen)" if at == best else ""
            mark += " (AGREE_AT)" if at == AGREE_AT else ""
            table.add_row(profile, f"{at:.2f}{mark}", pct(c.accuracy), pct(c.agree_same),
                          pct(c.agree_different), pct(t.accuracy), pct(t.agree_same),
                          pct(t.agree_different))
        test = by_half["test"]
        lines[f"{profile}: agree | same"] = (
            list(THRESHOLDS), [100 * (test[at].agree_same or 0) for at in THRESHOLDS])
        lines[f"{profile}: agree | different"] = (
            list(THRESHOLDS), [100 * (test[at].agree_different or 0) for at in THRESHOLDS])
        lines[f"{profile}: accuracy"] = (
            list(THRESHOLDS), [100 * test[at].accuracy for at in THRESHOLDS])
    print_table(table)
    note(f"machine: {load_before} at the start; {machine_load()} at the end")
    print_command()
    if args.plot:
        line_chart(args.plot, "Answer agreement by answer-cosine threshold (test half)",
                   "answer cosine threshold (short answers: exact match)", "%", lines,
                   subtitle=f"{args.model} ({args.precision}) answers, greedy, "
                   f"{args.max_tokens} tokens; same: QQP dev duplicates"
                   f"{' + Arena paraphrases' if args.arena else ''}; different: QQP dev "
                   f"non-duplicates with question cosine >= {BAND_FROM}",
                   y_limits=(0, 100))


if __name__ == "__main__":
    main()
