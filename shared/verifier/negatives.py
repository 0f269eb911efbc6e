"""Hard negatives made by code from training questions: the question changed in one
place so that it asks something else while still reading almost the same.

The mechanisms are generic edits, not a list of near-miss examples:
- negation: insert "not" after the first auxiliary verb, or drop an existing "not"/"n't";
- swaps within a small closed class of words (numbers by arithmetic; ordinals, colours,
  units, states of matter, weekdays, months, compass points and a short list of antonym
  and direction pairs by their class): the word is replaced by another of its class;
- named entities: a capitalised word (not the first) replaced by a capitalised word taken
  from another training question;
- reversed direction: "from A to B" becomes "from B to A";
- swapped order: the names on either side of an asymmetric word ("than", "to", "over",
  "before", "against"...) traded ("Is Python faster than Java?" / "Is Java faster than
  Python?"), while a trade around a symmetric one ("and", "or", "vs") is a label-1
  variant ("Python or Java?" / "Java or Python?");
- changed time or place: a year moved, an "in <Place>" moved to another place.
Each generated pair is labelled 0. Label-1 variants keep the model from learning "any
edit is a different question": case, punctuation and spacing, and rewordings that keep the
request: contractions ("what is"/"what's"), common abbreviations ("United States"/"US",
"artificial intelligence"/"AI"), "without"/"with no", "how do I"/"how to", and a symmetric
direction ("the distance from A to B" asks what "from B to A" asks; such a question is
therefore never a reversed-direction negative).
"""

import random
import re
from collections.abc import Callable, Sequence

from meancache.shared.words import asks_a_distance

WORD_CLASSES: tuple[tuple[str, ...], ...] = (
    ("first", "second", "third", "fourth", "fifth", "last"),
    ("1st", "2nd", "3rd", "4th", "5th"),
    ("red", "blue", "green", "yellow", "black", "white", "purple", "orange", "pink"),
    ("km", "miles", "meters", "feet", "inches", "centimeters"),
    ("kg", "pounds", "grams", "ounces", "tons"),
    ("celsius", "fahrenheit", "kelvin"),
    ("seconds", "minutes", "hours", "days", "weeks", "months", "years"),
    ("solid", "liquid", "gas", "plasma"),
    ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"),
    ("january", "february", "march", "april", "june", "july", "august", "september",
     "october", "november", "december"),
    ("north", "south", "east", "west"),
    ("morning", "evening", "night", "afternoon"),
    ("mac", "windows", "linux", "android", "ios"),
    ("cats", "dogs", "birds", "fish"),
    ("python", "java", "javascript", "c++", "ruby"),
)
ANTONYMS: tuple[tuple[str, str], ...] = (
    ("best", "worst"), ("good", "bad"), ("better", "worse"), ("increase", "decrease"),
    ("cheap", "expensive"), ("before", "after"), ("more", "less"), ("most", "least"),
    ("advantages", "disadvantages"), ("pros", "cons"), ("easy", "hard"), ("fast", "slow"),
    ("rich", "poor"), ("high", "low"), ("start", "stop"), ("buy", "sell"), ("win", "lose"),
    ("import", "export"), ("up", "down"), ("left", "right"), ("hot", "cold"),
    ("love", "hate"), ("old", "new"), ("big", "small"), ("long", "short"),
    ("men", "women"), ("male", "female"), ("positive", "negative"), ("gain", "lose"),
    ("legal", "illegal"), ("online", "offline"), ("true", "false"), ("safe", "dangerous"),
    ("husband", "wife"), ("boyfriend", "girlfriend"), ("mother", "father"),
)
AUXILIARIES = ("is", "are", "was", "were", "can", "could", "should", "would", "will",
               "does", "do", "did", "has", "have", "must", "may")
SUBJECTS = ("i", "you", "we", "they", "he", "she", "it", "one", "people")
_SWAPS = {w: cls for cls in WORD_CLASSES for w in cls}
_OPPOSITE = {a: b for a, b in ANTONYMS} | {b: a for a, b in ANTONYMS}
_WORD = re.compile(r"[A-Za-z][A-Za-z+']*|\d+(?:\.\d+)?")

Edit = Callable[[str, random.Random, Sequence[str]], str | None]


def _keep_case(original: str, replacement: str) -> str:
    return replacement.capitalize() if original[:1].isupper() else replacement


def _replace_one(text: str, rng: random.Random, pick: Callable[[str], str | None]) -> str | None:
    """Replace one word (chosen at random among those ``pick`` has a replacement for)."""
    spots = [(m, r) for m in _WORD.finditer(text) if (r := pick(m.group())) is not None]
    if not spots:
        return None
    match, replacement = rng.choice(spots)
    return text[:match.start()] + replacement + text[match.end():]


def negate(text: str, rng: random.Random, _: Sequence[str]) -> str | None:
    if re.search(r"\bnot\b", text, re.I):
        return re.sub(r"\s*\bnot\b", "", text, count=1, flags=re.I)
    if re.search(r"n't\b", text):
        return re.sub(r"n't\b", "", text, count=1).replace("wo ", "will ").replace("ca ", "can ")
    for match in _WORD.finditer(text):
        if match.group().lower() in AUXILIARIES:
            # "How do I learn" -> "How do I not learn"; "What is the" -> "What is not the"
            after = text[match.end():].split(" ", 2)
            if len(after) == 3 and after[1].lower() in SUBJECTS:
                return text[:match.end()] + " " + after[1] + " not " + after[2]
            return text[:match.end()] + " not" + text[match.end():]
    return None


def swap_class_word(text: str, rng: random.Random, _: Sequence[str]) -> str | None:
    def pick(word: str) -> str | None:
        cls = _SWAPS.get(word.lower())
        if cls is None:
            return None
        return _keep_case(word, rng.choice([w for w in cls if w != word.lower()]))
    return _replace_one(text, rng, pick)


def antonym(text: str, rng: random.Random, _: Sequence[str]) -> str | None:
    def pick(word: str) -> str | None:
        other = _OPPOSITE.get(word.lower())
        return None if other is None else _keep_case(word, other)
    return _replace_one(text, rng, pick)


def change_number(text: str, rng: random.Random, _: Sequence[str]) -> str | None:
    def pick(word: str) -> str | None:
        if not word[0].isdigit() or "." in word:
            return None
        n = int(word)
        if 1900 <= n <= 2100:  # a year: another year
            return str(n + rng.choice([-10, -5, -2, -1, 1, 2, 5, 10]))
        return str(rng.choice([n + 1, n + 2, max(0, n - 1), n * 2, n * 10, n + 5]) or n + 3)
    out = _replace_one(text, rng, pick)
    return None if out == text else out


def swap_entity(text: str, rng: random.Random, others: Sequence[str]) -> str | None:
    """A capitalised word (not the first word) replaced by one from another question."""
    words = list(_WORD.finditer(text))[1:]
    names = [m for m in words if m.group()[:1].isupper() and m.group().lower() not in _SWAPS
             and len(m.group()) > 1 and m.group() != "I"]
    if not names:
        return None
    target = rng.choice(names)
    for _ in range(10):
        donor = [m.group() for m in list(_WORD.finditer(rng.choice(others)))[1:]
                 if m.group()[:1].isupper() and len(m.group()) > 2]
        if donor and (choice := rng.choice(donor)) != target.group():
            return text[:target.start()] + choice + text[target.end():]
    return None


# "from A to B", each end one word or two ("my phone", "New York"), the second never a
# word that starts what follows the end ("from Lyon to Nice by car": B is "Nice")
_END = r"\w+(?: (?!(?:by|in|on|at|for|with|via|and|or|using|during|the|a|an)\b)\w+)?"
_FROM_TO = re.compile(rf"\bfrom ({_END}) (to|into) ({_END})")


def reverse_direction(text: str, rng: random.Random, _: Sequence[str]) -> str | None:
    """"from A to B" -> "from B to A"; "A into B" -> "B into A" (not where the answer is
    the same either way: ``symmetric_direction``)."""
    if asks_a_distance(text):
        return None
    match = _FROM_TO.search(text)
    if match:
        a, word, b = match.groups()
        return text[:match.start()] + f"from {b} {word} {a}" + text[match.end():]
    match = re.search(r"\b(\w+) (to|into|than) (\w+)\b", text)
    if match and match.group(1).lower() not in AUXILIARIES and match.group(1)[0].isupper():
        a, word, b = match.groups()
        return text[:match.start()] + f"{b} {word} {a}" + text[match.end():]
    return None


ASYMMETRIC = frozenset({"than", "to", "into", "from", "over", "before", "after", "against",
                        "beat", "beats", "under", "above", "below"})
SYMMETRIC = frozenset({"and", "or", "vs", "versus"})


def _name_like(word: str) -> bool:
    return (word[:1].isupper() and word != "I") or word[:1].isdigit() or word.lower() in _SWAPS


def _trade_around(text: str, connectives: frozenset[str]) -> str | None:
    """The name-like words nearest before and after a connective (within 3 words, not the
    question's first word) traded."""
    words = list(_WORD.finditer(text))
    for i, match in enumerate(words):
        if match.group().lower() not in connectives:
            continue
        before = [w for w in words[max(1, i - 3):i] if _name_like(w.group())]
        after = [w for w in words[i + 1:i + 4] if _name_like(w.group())]
        if before and after and before[-1].group().lower() != after[0].group().lower():
            a, b = before[-1], after[0]
            return (text[:a.start()] + b.group() + text[a.end():b.start()] + a.group()
                    + text[b.end():])
    return None


def swap_order(text: str, rng: random.Random, _: Sequence[str]) -> str | None:
    """"Is Python faster than Java?" -> "Is Java faster than Python?"."""
    return _trade_around(text, ASYMMETRIC)


def symmetric_variant(text: str) -> str | None:
    """A label-1 variant where one exists: "Python or Java?" -> "Java or Python?"."""
    return _trade_around(text, SYMMETRIC)


EDITS: dict[str, Edit] = {
    "negation": negate, "class swap": swap_class_word, "antonym": antonym,
    "number": change_number, "entity": swap_entity, "direction": reverse_direction,
    "order swap": swap_order,
}


def symmetric_direction(text: str) -> str | None:
    """A label-1 variant where one exists: "the distance from A to B" -> "from B to A"."""
    match = _FROM_TO.search(text) if asks_a_distance(text) else None
    if match is None:
        return None
    a, word, b = match.groups()
    return text[:match.start()] + f"from {b} {word} {a}" + text[match.end():]


# The same words either way (a closed list of general English, as the word classes above
# are), written as they are written mid-sentence. An abbreviation in capitals matches only
# in capitals ("US", never the "us" of "tell us"); anything else in any case.
EQUIVALENTS: tuple[tuple[str, str], ...] = (
    ("what is", "what's"), ("it is", "it's"), ("that is", "that's"), ("do not", "don't"),
    ("does not", "doesn't"), ("cannot", "can't"), ("is not", "isn't"), ("are not", "aren't"),
    ("I am", "I'm"), ("how do I", "how can I"), ("how do I", "how to"),
    ("without", "with no"), ("is it possible to", "can I"), ("tell me", "explain"),
    ("United States", "US"), ("United States", "USA"), ("United Kingdom", "UK"),
    ("European Union", "EU"), ("New York City", "NYC"), ("artificial intelligence", "AI"),
    ("machine learning", "ML"), ("as soon as possible", "ASAP"), ("television", "TV"),
    ("approximately", "approx."), ("information", "info"), ("application", "app"),
    ("versus", "vs"), ("for example", "e.g."), ("photograph", "photo"),
    ("mathematics", "math"), ("kilometers", "km"), ("kilograms", "kg"),
    ("minutes", "mins"), ("laboratory", "lab"), ("advertisement", "ad"),
)


def _phrase(words: str) -> re.Pattern[str]:
    flags = 0 if words.isupper() else re.I
    return re.compile(r"(?<![\w'])" + re.escape(words) + r"(?![\w'])", flags)


_EQUIVALENT_PATTERNS = [(_phrase(a), b) for a, b in EQUIVALENTS] \
    + [(_phrase(b), a) for a, b in EQUIVALENTS]


def reworded(text: str, rng: random.Random) -> str | None:
    """One of ``EQUIVALENTS`` applied, either way round, where the text has one."""
    found = [(m, other) for pattern, other in _EQUIVALENT_PATTERNS
             if (m := pattern.search(text)) is not None]
    if not found:
        return None
    match, other = rng.choice(found)
    if match.start() == 0 and match.group()[:1].isupper():  # a sentence's first word
        other = other[:1].upper() + other[1:]
    return text[:match.start()] + other + text[match.end():]


def same_question_variant(text: str, rng: random.Random) -> str:
    """A label-1 variant: the same question typed differently, or reworded where a
    rewording that keeps the request applies (then more often: it is the harder lesson)."""
    words = [v for v in (reworded(text, rng), symmetric_direction(text)) if v]
    if words and rng.random() < 0.75:
        return rng.choice(words)
    choice = rng.randrange(4)
    if choice == 0:
        return text.lower()
    if choice == 1:
        return text.rstrip("?.! ")
    if choice == 2:
        return text.upper()
    return re.sub(r"\s+", " ", text.replace("?", " ?")).strip()


def generate(questions: Sequence[str], count: int, seed: int) -> list[tuple[str, str, int, str]]:
    """``count`` hard negatives ``(q, edited, 0, kind)`` spread over the edit kinds, from
    ``questions`` in a seeded random order."""
    rng = random.Random(seed)
    order = list(questions)
    rng.shuffle(order)
    kinds = list(EDITS)
    counts = {kind: 0 for kind in kinds}
    out: list[tuple[str, str, int, str]] = []
    for question in order:
        if len(out) >= count:
            break
        # the kind made least so far first, so that the common edits do not crowd out
        for kind in sorted(kinds, key=lambda kind: counts[kind]):
            edited = EDITS[kind](question, rng, order)
            if edited and edited.strip() and edited.lower() != question.lower():
                out.append((question, edited, 0, kind))
                counts[kind] += 1
                break
    return out
