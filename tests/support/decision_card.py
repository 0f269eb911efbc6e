"""The shipped decision card as if fitted on another encoder: the tests run the packaged
MiniLM, and the card names MPNet, so with it the rules decide. Where a test needs the
learned decision itself, only the card's ``encoder_version`` is changed, the card
re-hashed and loaded through ``LearnedDecision.from_card`` as any card is, and the
matcher's loader pointed at it."""

import json

import pytest
from meancache.client.matching import matcher
from meancache.shared.verifier.decision import CARD_PATH, LearnedDecision, card_digest


def use_card_for(encoder_version: str, monkeypatch: pytest.MonkeyPatch) -> LearnedDecision:
    card = json.loads(CARD_PATH.read_text(encoding="utf-8"))
    card["encoder_version"] = encoder_version
    card["sha256"] = card_digest(card)
    decision = LearnedDecision.from_card(card)
    monkeypatch.setattr(matcher, "learned_decision", lambda: decision)
    return decision
