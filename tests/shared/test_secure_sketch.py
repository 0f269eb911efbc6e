"""The entries a SecAgg+ device sends under an upload cap (shared.fl.secure): the same on
every side for a round and a tensor's name, exactly the share asked for, within the cap,
and new ones each round, so that every entry is summed in some round; a share no server
should ask for refused by the device (client.fl.secure)."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat as compat
from hypothesis import given
from hypothesis import strategies as st
from meancache.client.fl.secure import MAX_EXAMPLES, RESIDUAL, _train_legacy
from meancache.shared.fl.secure import (
    MASKED_BYTES,
    NAMES,
    SKETCH_SEED,
    SKETCH_SHARE,
    WHOLE,
    sketch_entries,
    sketch_share,
)

from tests.support.fl import message
from tests.support.fuzz import fuzzed

SIZES = st.lists(st.integers(1, 20_000), min_size=1, max_size=12)


@fuzzed()
@given(SIZES, st.floats(0.05, 2.0))
def test_the_share_keeps_the_sent_entries_within_the_cap(sizes: list[int],
                                                         fraction: float) -> None:
    """A cap between the small tensors' bytes and the whole's: what is sent (small
    tensors whole, ``floor(share * size)`` of each large one) never exceeds it."""
    small = sum(s for s in sizes if s <= WHOLE)
    whole = MASKED_BYTES * sum(sizes)
    cap = MASKED_BYTES * small + fraction * (whole - MASKED_BYTES * small) + 1
    share = sketch_share(sizes, cap)
    sent = sum(s if (e := sketch_entries(s, share, 1, f"t{i}")) is None else len(e)
               for i, s in enumerate(sizes))
    assert MASKED_BYTES * sent <= cap
    assert (share == 1) == (cap >= whole)


@fuzzed()
@given(st.integers(WHOLE + 1, 50_000), st.floats(0.01, 0.99), st.integers(0, 2**40),
       st.text(min_size=1, max_size=40))
def test_the_entries_are_the_share_asked_for_and_the_same_on_every_side(
        size: int, share: float, seed: int, name: str) -> None:
    entries = sketch_entries(size, share, seed, name)
    assert entries is not None and len(entries) == int(share * size)
    assert np.all(np.diff(entries) > 0) and (len(entries) == 0 or entries[-1] < size)
    assert np.array_equal(entries, sketch_entries(size, share, seed, name))


def test_each_round_and_each_tensor_draws_other_entries() -> None:
    """Rounds are independent draws: two rounds' shares of 0.2 overlap in about 0.2 x 0.2
    of the entries (binomial, 100,000 entries: within 5 standard deviations), and after
    30 rounds every entry was sent in one (a miss has chance 0.8^30 = 1.2e-3 each: about
    124 of 100,000 expected; at most a few hundred)."""
    size, share = 100_000, 0.2
    rounds = [set(sketch_entries(size, share, r, "w").tolist()) for r in range(30)]
    overlap = len(rounds[0] & rounds[1]) / size
    sd = (share**2 * (1 - share**2) / size) ** 0.5
    assert abs(overlap - share**2) < 5 * sd
    assert rounds[0] != set(sketch_entries(size, share, 0, "v").tolist())
    missed = size - len(set().union(*rounds))
    assert missed < 124 + 5 * 124**0.5


def test_small_tensors_and_a_share_of_one_go_whole_and_a_cap_too_small_is_refused() -> None:
    assert sketch_entries(WHOLE, 0.1, 0, "bias") is None
    assert sketch_entries(10 * WHOLE, 1.0, 0, "w") is None
    assert sketch_share([WHOLE, 10 * WHOLE], 0) == 1.0  # 0: no cap
    with pytest.raises(ValueError, match="small tensors alone"):
        sketch_share([WHOLE, 10 * WHOLE], MASKED_BYTES * WHOLE)


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5, float("nan")])
def test_a_device_refuses_a_share_no_server_should_ask_for(share: float) -> None:
    """The share comes from the server: a device checks it before it trains or sends."""
    fitins = FitIns(ndarrays_to_parameters([np.zeros((40, 40), np.float32)]),
                    {NAMES: "w", MAX_EXAMPLES: 10, SKETCH_SHARE: share, SKETCH_SEED: 1})
    trained = []
    with pytest.raises(ValueError, match="asks for a share"):
        _train_legacy(message(compat.fitins_to_recorddict(fitins, keep_input=True)),
                      Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                              run_config={}),
                      lambda m, c: trained.append(m))
    assert trained == []


def _round(start: np.ndarray, update: np.ndarray, share: float, seed: int,
           context: Context, clip: float) -> np.ndarray:
    """One secure round's legacy fit on a device whose training adds ``update``: what it
    puts into the masked sum (before masking)."""
    fitins = FitIns(ndarrays_to_parameters([start]),
                    {NAMES: "w", MAX_EXAMPLES: 10, SKETCH_SHARE: share, SKETCH_SEED: seed,
                     "clipping_norm": clip})

    def train(msg: Message, _: Context) -> Message:
        sent = msg.content["arrays"]["w"].numpy()
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(sent + update)}),
                                   "metrics": MetricRecord({"num-examples": 5})}),
                       reply_to=msg)

    reply = _train_legacy(message(compat.fitins_to_recorddict(fitins, keep_input=True)),
                          context, train)
    return parameters_to_ndarrays(compat.recorddict_to_fitres(reply.content,
                                                              keep_input=True).parameters)[0]


def test_what_a_device_did_not_send_goes_with_its_next_round() -> None:
    """Error feedback: over three rounds, what was summed plus what is still kept equals
    everything the device trained (nothing is lost, nothing counted twice), and what is
    sent each round stays within the clipping norm."""
    rng = np.random.default_rng(0)
    size, share, clip = 4 * WHOLE, 0.25, 0.5
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                      run_config={})
    trained = np.zeros(size)
    summed = np.zeros(size)
    for seed in range(3):
        start = rng.normal(size=size).astype(np.float32)
        update = (rng.normal(size=size) * 0.01).astype(np.float32)
        trained += update
        sent = _round(start, update, share, seed, context, clip)
        entries = sketch_entries(size, share, seed, "w")
        part = sent.astype(np.float64) - start.astype(np.float64)[entries]
        assert np.linalg.norm(part) <= clip * (1 + 1e-6)
        summed[entries] += part
    kept = context.state.array_records[RESIDUAL]["w"].numpy()
    # the sent weights are float32: each round rounds a sent value (|w| < 5 with this
    # seed) by at most one ulp, 5 * 2**-23, and the kept rest (|r| < 1) by far less
    assert np.allclose(summed + kept, trained, rtol=0, atol=3 * 5 * 2**-23 + 1e-7)
    assert np.linalg.norm(kept) > 0  # most of it waits: a share of 0.25 a round
