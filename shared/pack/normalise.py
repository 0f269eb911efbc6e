"""The one normalisation of instructions: the builder keys a pack by it and the device
looks queries up by it, so both must produce the same key for the same question.

The rules, in order:
1. Unicode NFKC, so full-width letters, ligatures and compatibility forms compare equal
   to their plain forms;
2. ``casefold`` (a stronger ``lower``: "Straße" and "STRASSE" meet), as InstCache
   lower-cases instructions;
3. every run of white space (newlines and tabs included) becomes one space, and the ends
   are stripped;
4. trailing sentence punctuation (``.?!`` and their full-width forms, and white space
   between them) is dropped: "What is Python?" and "what is python" are one question.
   Punctuation inside the text is kept: it can change the meaning ("3.5", "C++").
"""

import re
import unicodedata

_SPACE = re.compile(r"\s+")
_TRAILING = re.compile(r"[\s.?!。？！…]+$")


def normalise_instruction(text: str) -> str:
    """The lookup key of an instruction; "" when nothing but punctuation is left."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _SPACE.sub(" ", text).strip()
    return _TRAILING.sub("", text)
