"""Words that change what a question asks, shared by the cache's word rules
(``client.matching.rules``) and the filter on the language models' rewordings
(``shared.verifier.paraphrase``): negations, number words, the stop words that change
nothing, what asks the same either way round, and a crude stem that matches
inflections."""

import re
from functools import cache

NEGATIONS = frozenset({
    "not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "nowhere",
    "cannot", "without", "unable", "dont", "doesnt", "didnt", "isnt", "arent", "wasnt",
    "werent", "cant", "wont", "wouldnt", "shouldnt", "couldnt", "havent", "hasnt",
})


# Number words, as the digits they stand for where they have one.
NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
    "thirteen": "13", "fourteen": "14", "fifteen": "15", "sixteen": "16", "seventeen": "17",
    "eighteen": "18", "nineteen": "19", "twenty": "20", "thirty": "30", "forty": "40",
    "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80", "ninety": "90",
    "hundred": "100", "thousand": "1000", "million": "1000000", "billion": "1000000000",
    "first": "1st", "second": "2nd", "third": "3rd", "fourth": "4th", "fifth": "5th",
    "sixth": "6th", "seventh": "7th", "eighth": "8th", "ninth": "9th", "tenth": "10th",
    "half": "half", "quarter": "quarter", "double": "twice", "twice": "twice",
    "triple": "thrice", "thrice": "thrice",
}


# A question whose answer is the same either way round ("the distance from A to B" asks
# what "from B to A" asks): the code-made data labels the reversal the same question
# (shared.verifier.negatives), and the direction check does not veto it.
_DISTANCE = re.compile(r"\b(distance|how far|how many (?:miles|kilometers|km))\b", re.I)
EITHER_WAY_ROUND = frozenset({"from", "to", "into"})  # the words of such a reversal


def asks_a_distance(text: str) -> bool:
    """Whether ``text`` asks a distance, which is the same from either end."""
    return _DISTANCE.search(text) is not None


@cache
def stop_words() -> frozenset[str]:
    """scikit-learn's English stop words less the negations and number words, which change
    what a question asks. Imported on first use: importing scikit-learn takes longer (0.7 s)
    than a whole lookup."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return frozenset(ENGLISH_STOP_WORDS - NEGATIONS - NUMBER_WORDS.keys())


def stem(word: str) -> str:
    """A crude stem, enough to match "increasing" with "increase" and "wins" with "win"."""
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith("ing") and len(word) > 5:
        word = word[:-3]
    elif word.endswith("ed") and len(word) > 4:
        word = word[:-2]
    elif word.endswith("s") and not word.endswith("ss") and len(word) > 3:
        word = word[:-1]
    return word[:-1] if word.endswith("e") and len(word) > 3 else word
