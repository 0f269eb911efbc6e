"""The learned verifier: a cross-encoder that reads a new question and a stored one
together and says how likely they are the same question (client.matching.matcher asks it
before any stored answer is served). Training and export (torch) live in ``train`` and
``model``; the client needs only ``runtime``."""
