"""Paraphrases and statements written by the packaged language models (issue 35, part 2):
pairs of the same request in other words, for the teacher to judge and the student to
learn from, beyond QQP's style.

A seeded sample of Arena and ShareGPT first turns (the texts ``mine.question_sets`` reads,
under the same character cap and never the excluded near-miss sets) is rephrased by Gemma
3 270M (a base model: a few-shot completion) or SmolLM2-135M-Instruct (its chat template,
the same examples as turns). The cache stores whatever users send, so ``statement`` turns
a question into a declarative request first and rephrases that. Small models loop, echo
and ramble: an output is kept only past the rules of ``reject_reason``, and every
rejection is counted by its reason.

The run appends as it goes (``<out>`` the kept pairs, ``<out>.rejected.jsonl`` the rest)
and a rerun skips every question already done for that model and kind, so a killed run
continues where it stopped. Each pair's split is ``mine.split_of`` of its two texts.
"""

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from meancache.shared.errors import VerifierError
from meancache.shared.files import whole_lines, write_atomic
from meancache.shared.jsonl import jsonl_lines
from meancache.shared.progress import Progress
from meancache.shared.verifier.mine import Question, question_sets, split_of
from meancache.shared.words import NEGATIONS, NUMBER_WORDS, stem, stop_words

KINDS = ("paraphrase", "statement")
ORIGINS = ("arena", "sharegpt")

PARAPHRASE = ("Rewrite each text in other words. Keep its meaning, its language and its "
              "form (a question stays a question, a request a request).",
              "Text", "Rewritten",
              (("How do I make pancakes without eggs?",
                "What's a way to make pancakes when I have no eggs?"),
               ("Write a short poem about autumn leaves.",
                "Compose a brief poem on the leaves of autumn."),
               ("what is the difference between a list and a tuple in python",
                "how does a python list differ from a tuple"),
               ("I need a name for my new bakery.",
                "I'm looking for a name for the bakery I'm opening."),
               ("Explain how vaccines train the immune system.",
                "Describe the way vaccines teach the immune system.")))
STATEMENT = ("Turn each question into a statement or request that asks for the same "
             "thing, without a question mark.",
             "Question", "Statement",
             (("How do I make pancakes without eggs?", "I want to make pancakes without eggs."),
              ("Why is the sky blue?", "Tell me why the sky is blue."),
              ("What is the difference between a list and a tuple in Python?",
               "Explain the difference between a Python list and a tuple."),
              ("Which countries border Germany?",
               "I'd like a list of the countries that border Germany."),
              ("can you recommend a good book on stoicism?",
               "recommend me a good book on stoicism")))
TASKS = {"paraphrase": PARAPHRASE, "statement": STATEMENT}

# An output this much shorter or longer (in characters) than its source says something
# else: a fragment, or an answer instead of a rewording.
MIN_RATIO, MAX_RATIO = 0.4, 2.5
# How a chat model starts a reply instead of a rewording ("Here is a Python program ...",
# "I'm excited to create captions ...").
REPLY = re.compile(r"(here is|here's|here are|sure\b|certainly|of course|i'm|i am|i'd be|"
                   r"i can|i will|i'll)", re.IGNORECASE)
# A long source (this many content words or more) may lose one of them in a rewording ("a
# short Python program" -> "a Python program"); a shorter one none. Numbers and negations
# are never lost.
LONG_SOURCE = 6
REASONS = ("empty", "unfinished", "same", "repeats", "reply", "question", "too_short",
           "too_long", "dropped")


@dataclass(frozen=True)
class LanguageModel:
    """A loaded causal LM; ``chat`` when it is instruction-tuned (prompted through its
    chat template), else a base model prompted by few-shot completion."""

    name: str
    model: object
    tokenizer: object
    chat: bool


@dataclass(frozen=True)
class Output:
    text: str  # the first line, cleaned
    finished: bool  # stopped by itself (end of line or of turn), not by the token cap
    new_tokens: int


def one_line(text: str) -> str:
    return " ".join(text.split())


def prompt(lm: LanguageModel, task: str, text: str) -> str:
    """The prompt that asks ``lm`` to do ``task`` ("paraphrase" or "statement") on ``text``
    (as one line: the few-shot format is a line per text)."""
    instruction, ask, answer, examples = TASKS[task]
    text = one_line(text)
    if lm.chat:
        messages = [{"role": "system", "content": instruction}]
        for source, target in examples:
            messages += [{"role": "user", "content": source},
                         {"role": "assistant", "content": target}]
        messages.append({"role": "user", "content": text})
        return lm.tokenizer.apply_chat_template(messages, tokenize=False,  # type: ignore[attr-defined]
                                                add_generation_prompt=True)
    shots = "".join(f"{ask}: {source}\n{answer}: {target}\n\n" for source, target in examples)
    return f"{instruction}\n\n{shots}{ask}: {text}\n{answer}:"


def _norm(text: str) -> str:
    """Case, punctuation and spacing dropped: what "the same text" compares."""
    return " ".join(re.sub(r"[\W_]+", " ", text.lower()).split())


def reject_reason(source: str, output: Output, statement: bool) -> str | None:
    """Why ``output`` is no rewording of ``source`` (one of ``REASONS``), or None;
    ``statement`` when the output must not be a question (a statement, or its rewording)."""
    text, words = output.text, _norm(output.text).split()
    if not words:
        return "empty"
    if not output.finished:
        return "unfinished"
    if _norm(text) == _norm(source):
        return "same"
    trigrams = list(zip(words, words[1:], words[2:], strict=False))
    if len(set(trigrams)) < len(trigrams) or re.search(r"(\b\w+\b)(\W+\1\b){2}", text.lower()) \
            or re.search(r"(.)\1{7}", text):
        return "repeats"
    if REPLY.match(text) and not REPLY.match(source.lstrip()):
        return "reply"
    if statement and text.rstrip().endswith("?"):
        return "question"
    ratio = len(_norm(text)) / max(1, len(_norm(source)))
    if ratio < MIN_RATIO:
        return "too_short"
    if ratio > MAX_RATIO:
        return "too_long"
    if dropped_words(source, text):
        return "dropped"
    return None


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower().replace("\u2019", "'").replace("n't", " not"))


def dropped_words(source: str, text: str) -> list[str]:
    """The content words of ``source`` that ``text`` lost, where losing them makes it ask
    something else (else ``[]``): any number or negation; or, where ``text`` only
    deleted (it has no content word of its own), more than a source of its length may
    lose (``LONG_SOURCE``). Small models "reword" by dropping qualifiers ("write a
    friendship day letter" -> "write a letter"), which the teacher does not always catch;
    a rewording that replaces words ("make a good cup" -> "brew the best") is left to the
    judges. A word is kept in any inflection (``stem``), a number as digits or a word, a
    negation as any negation."""
    def is_number(word: str) -> bool:
        return word[0].isdigit() or word in NUMBER_WORDS

    def content(words: list[str]) -> list[str]:
        return [w for w in words if is_number(w) or w in NEGATIONS
                or (len(w) >= 3 and w not in stop_words())]

    words, theirs = _words(text), list(dict.fromkeys(content(_words(source))))
    stems = {stem(w) for w in words}
    numbers = {NUMBER_WORDS.get(w, w) for w in words if is_number(w)}
    negated = any(w in NEGATIONS for w in words)

    def kept(word: str) -> bool:
        if word in NEGATIONS:
            return negated
        if is_number(word):
            return NUMBER_WORDS.get(word, word) in numbers
        return stem(word) in stems

    lost = [w for w in theirs if not kept(w)]
    vital = [w for w in lost if is_number(w) or w in NEGATIONS]
    added = {stem(w) for w in content(words)} - {stem(w) for w in theirs}
    deleted_only = not added and len(lost) > (len(theirs) >= LONG_SOURCE)
    return lost if vital or deleted_only else []


def _clean(text: str, task: str) -> str:
    """The first line, without quotes around it or a label the few-shot format invites."""
    line = text.split("\n", 1)[0].strip()
    _, ask, answer, _ = TASKS[task]
    for label in (f"{answer}:", f"{ask}:"):
        if line.startswith(label):
            line = line[len(label):].strip()
    if len(line) >= 2 and line[0] in "\"'\u201c" and line[-1] in "\"'\u201d":
        line = line[1:-1].strip()
    return line


def generate(lm: LanguageModel, prompts: list[str], task: str, max_new_tokens: int,
             temperature: float, seed: int) -> list[Output]:
    """One output per prompt, generated as one left-padded batch (on two cores a batch of
    8 costs little more per step than one); greedy at temperature 0, else sampled with
    ``seed``. A row stops at its first line's end or the model's end of turn."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    tokenizer = lm.tokenizer
    tokenizer.padding_side = "left"  # type: ignore[attr-defined]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
        else tokenizer.eos_token_id  # type: ignore[attr-defined]
    tokenizer.pad_token_id = pad  # type: ignore[attr-defined]
    inputs = tokenizer(prompts, return_tensors="pt", padding=True,  # type: ignore[operator]
                       add_special_tokens=not lm.chat)
    start = inputs["input_ids"].shape[1]

    class EndOfLine(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor,
                     **kwargs: object) -> torch.Tensor:
            texts = tokenizer.batch_decode(input_ids[:, start:], skip_special_tokens=True)  # type: ignore[attr-defined]
            return torch.tensor(["\n" in t.lstrip("\n ") for t in texts])

    torch.manual_seed(seed)
    sampled = temperature > 0
    with torch.no_grad():
        ids = lm.model.generate(  # type: ignore[attr-defined]
            **inputs, max_new_tokens=max_new_tokens, do_sample=sampled, pad_token_id=pad,
            stopping_criteria=StoppingCriteriaList([EndOfLine()]),
            **({"temperature": temperature, "top_p": 0.95} if sampled else
               {"temperature": None, "top_p": None, "top_k": None}))
    outputs = []
    eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
    for row in ids[:, start:].tolist():
        used = row[:row.index(eos)] if eos in row else [t for t in row if t != pad]
        raw = tokenizer.decode(used, skip_special_tokens=True).lstrip("\n ")  # type: ignore[attr-defined]
        finished = eos in row or "\n" in raw
        outputs.append(Output(_clean(raw, task), finished, len(used)))
    return outputs


def sample(data_root: Path, limit: int, seed: int, max_chars: int, statements: bool,
           exclude: tuple[Path, ...] = ()) -> list[Question]:
    """A seeded sample of Arena and ShareGPT first turns (questions only for statements),
    in a fixed order: the same arguments give the same list, so a rerun finds its place."""
    found = [q for q in question_sets(data_root, max_chars, exclude) if q.source in ORIGINS
             and (not statements or q.text.rstrip().endswith("?"))]
    order = np.random.default_rng(seed).permutation(len(found))
    return [found[i] for i in order[:limit]]


def rejected_path(out: Path) -> Path:
    return out.with_suffix(".rejected.jsonl")


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL written here (none when the file is absent)."""
    if not path.is_file():
        return []
    try:
        return [json.loads(line) for _, line in jsonl_lines(path.read_text(encoding="utf-8"))]
    except (OSError, ValueError) as exc:
        raise VerifierError(f"cannot read {path}: {exc}; move it aside or pass another "
                            "--out") from None


def _append(path: Path, rows: list[dict]) -> None:
    """Whole rows, on disk before the next batch starts."""
    if not rows:
        return
    with path.open("a", encoding="utf-8") as file:
        file.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        file.flush()
        os.fsync(file.fileno())


def _batch_seed(seed: int, model: str, kind: str, first: str) -> int:
    digest = hashlib.sha256(f"{seed}\n{model}\n{kind}\n{first}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


@dataclass(frozen=True)
class Settings:
    kind: str = "paraphrase"
    limit: int = 100
    seed: int = 0
    max_chars: int = 300  # mine-pairs' cap
    max_new_tokens: int = 64
    temperature: float = 0.7
    batch: int = 8


def make_paraphrases(data_root: Path, out: Path, lm: LanguageModel, settings: Settings,
                     exclude: tuple[Path, ...] = (), progress: Progress | None = None
                     ) -> dict:
    """Rephrase the sample (continuing a run in ``out``), append each batch's pairs and
    rejections, and write the counts of the whole file beside it (``<out>.json``)."""
    if settings.kind not in KINDS:
        raise VerifierError(f"unknown kind {settings.kind!r}; choose one of {KINDS}")
    out.parent.mkdir(parents=True, exist_ok=True)
    rejected = rejected_path(out)
    for path in (out, rejected):
        whole_lines(path)
    done = {(r["model"], r["kind"], r["question"])
            for r in read_jsonl(out) + read_jsonl(rejected)}
    chosen = sample(data_root, settings.limit, settings.seed, settings.max_chars,
                    settings.kind == "statement", exclude)
    todo = [q for q in chosen if (lm.name, settings.kind, q.text) not in done]
    started, cpu, tokens, calls = time.monotonic(), time.process_time(), 0, 0
    for start in range(0, len(todo), settings.batch):
        batch = todo[start:start + settings.batch]
        kept, dropped, used, made = _rephrase(batch, lm, settings)
        tokens, calls = tokens + used, calls + made
        _append(out, kept)
        _append(rejected, dropped)
        if progress is not None:
            progress(start + len(batch), len(todo))
    seconds, cpu = time.monotonic() - started, time.process_time() - cpu
    # On a shared machine the wall time says more about the neighbours than the model:
    # the CPU time (all threads) says what the generation cost.
    run = {"model": lm.name, "kind": settings.kind, "questions": len(todo),
           "generations": calls, "new_tokens": tokens, "seconds": round(seconds, 1),
           "cpu_seconds": round(cpu, 1),
           "tokens_per_second": round(tokens / seconds, 2) if seconds > 0 else None,
           "tokens_per_cpu_second": round(tokens / cpu, 2) if cpu > 0 else None,
           "settings": settings.__dict__}
    return write_summary(out, run)


def _rephrase(batch: list[Question], lm: LanguageModel, settings: Settings
              ) -> tuple[list[dict], list[dict], int, int]:
    """Kept and rejected rows of one batch, the new tokens and the generations spent."""
    seed = _batch_seed(settings.seed, lm.name, settings.kind, batch[0].text)
    base = {"model": lm.name, "kind": settings.kind}
    dropped: list[dict] = []
    sources = [(q, q.text) for q in batch]
    tokens, calls = 0, 0
    steps = ("statement", "paraphrase") if settings.kind == "statement" else ("paraphrase",)
    for step in steps:
        if not sources:  # every statement of the batch was rejected
            break
        outputs = generate(lm, [prompt(lm, step, text) for _, text in sources], step,
                           settings.max_new_tokens, settings.temperature, seed)
        tokens, calls = tokens + sum(o.new_tokens for o in outputs), calls + len(outputs)
        survivors = []
        for (question, text), output in zip(sources, outputs, strict=True):
            reason = reject_reason(text, output, settings.kind == "statement")
            if reason is None:
                survivors.append((question, text, output.text))
            else:
                dropped.append({**base, "question": question.text, "origin": question.source,
                                "step": step, "reason": reason, "source": text,
                                "output": output.text})
        if step == "statement":
            sources = [(q, made) for q, _, made in survivors]
    kept = [{**base, "question": q.text, "origin": q.source, "source": source,
             "paraphrase": made, "split": split_of(source, made, settings.seed)}
            for q, source, made in survivors]
    return kept, dropped, tokens, calls


def write_summary(out: Path, run: dict | None = None) -> dict:
    """Kept and rejected counts (by reason) per model and kind over the whole of ``out``,
    and every run's speed, into ``<out>.json``."""
    summary_path = out.with_suffix(".json")
    runs = read_summary(summary_path).get("runs", [])
    if run is not None:
        runs.append(run)
    counts: dict[str, dict] = {}

    def entry(row: dict) -> dict:
        return counts.setdefault(f"{row['model']}/{row['kind']}",
                                 {"kept": 0, "rejected": {}, "splits": {}})

    for row in read_jsonl(out):
        found = entry(row)
        found["kept"] += 1
        found["splits"][row["split"]] = found["splits"].get(row["split"], 0) + 1
    for row in read_jsonl(rejected_path(out)):
        reasons = entry(row)["rejected"]
        key = f"{row['step']}:{row['reason']}" if row["kind"] == "statement" else row["reason"]
        reasons[key] = reasons.get(key, 0) + 1
    summary = {"counts": counts, "runs": runs}
    write_atomic(summary_path, json.dumps(summary, indent=2) + "\n")
    return summary


def read_summary(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise VerifierError(f"cannot read {path}: {exc}") from None


