"""What both sides of a SecAgg+ round (fl_server.secure_rounds, client.fl.secure) agree
on beyond Flower's protocol: Flower's legacy messages carry unnamed weight lists and
scalar metrics only, so the tensors' names travel in the fit config (in the order of the
list) and the evidence histograms (shared.fl.evidence, shared.fl.bound_evidence) as JSON
text."""

import json
from collections.abc import Mapping
from typing import Any

from meancache.shared.fl.bound_evidence import COSINE_KEYS
from meancache.shared.fl.bound_evidence import KEYS as BOUND_KEYS
from meancache.shared.fl.evidence import KEYS as SIMILARITY_KEYS

KEYS = (*SIMILARITY_KEYS, *BOUND_KEYS, *COSINE_KEYS)  # the lists a reply's metrics hold

NAMES = "tensor-names"  # fit-config key: the weights' names, one a line, in list order
SECURE = "secure-aggregation"  # fit-config key: this round is SecAgg+ (no quantised update)


def to_scalars(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Metrics with each histogram as JSON text."""
    return {k: json.dumps(list(v)) if k in KEYS else v for k, v in metrics.items()}


def from_scalars(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The histograms read back (ValueError for one that is not a JSON list; its
    numbers are checked by shared.fl.evidence and shared.fl.bound_evidence)."""
    out = dict(metrics)
    for key in KEYS:
        if key in out:
            try:
                value = json.loads(str(out[key]))
            except ValueError:
                raise ValueError(f"'{key}' is not a JSON list") from None
            out[key] = value
    return out
