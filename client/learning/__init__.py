"""What the cache learns from its own traffic about where it may answer: the error bound
the user sets (``bound``), labels without a person (``agreement``, ``explore``), and the
persistent record of labels and aliases (``state``). No model is loaded here."""
