"""Matching by meaning: the one decision "this stored question answers that one" for
every source that matches by meaning (the instruction pack's similar match, the semantic
cache), and what feedback on a served match teaches. Below the pack and the cache: both
ask it, it imports neither.

- ``question.py``: a question cleaned once (``Query``), as a decision compares it
  (``Question``), a stored one a source offers (``Candidate``);
- ``matcher.py``: the decision (``Matcher``: tau and per-entry thresholds, candidate
  count, verifier, over-long questions, the question's vector);
- ``feedback.py``: a served match and its rejection recorded, tau re-tuned;
- ``labels.py``: the labelled pairs as stored, and which of them teach;
- ``decision.py``: the learned decision whether the verifier's pick is served, and its
  card;
- ``entry_threshold.py``: an entry's own threshold from its feedback;
- ``rules.py``: the rule checks (negation, numbers, names, direction, ...);
- ``origins.py``: where an answer came from, and whether it may be rejected;
- ``settings.py``: the settings a decision reads.

Importing the package is light; the matcher (its verifier loads scikit-learn) is imported
only where a similar match is decided.
"""
