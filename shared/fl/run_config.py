"""Typed, validated reading of a federated run's config (Flower's run config).

The defaults live only in the Flower app's ``[tool.flwr.app.config]``
(``fl_server/flower_app/pyproject.toml``), which Flower merges under every run's
overrides: a missing key means the run was started from another meancache version's app,
so it is an error here, never a silent default.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from meancache.shared.errors import RunConfigError

RunConfig = Mapping[str, bool | int | float | str]

# The keys a device's ClientApp reads (shared.fl.client_config.ClientConfig, which a test
# holds to exactly these). Their values (and SHAPING_KEYS') must come from the operator's
# signed app: `fl run` and `fl sign-app` write them into the app, and the Fleet gateway
# refuses to hand the signature of an app to a run that overrides any of them
# (fl_server.fleet_gateway).
DEVICE_KEYS = frozenset({
    "encoder-model", "top-layers", "train-encoder", "seed", "epochs", "batch-size", "learning-rate",
    "min-pairs", "data-source", "qqp-path", "partitioning", "pairs-per-client", "cache-dir",
    "update-bits", "update-rank", "verifier-top-layers", "verifier-model",
})
# The server's keys that shape what devices receive each round: the global weights
# (screening, aggregation, central DP noise and the clipping norm a device is told to clip
# to) and the global threshold (its tuning rule). A run could otherwise lower the bar for
# a poisoned update or move every device's threshold by overriding them outside the
# signature, so they travel as DEVICE_KEYS do. What only schedules a run (rounds, node
# counts, fractions, timeouts), where the server keeps its checkpoints, how it scores them
# and the delta its epsilon is reported at stay a run's own overrides.
SHAPING_KEYS = frozenset({
    "max-examples", "max-update-norm", "aggregation", "threshold-prior-pairs",
    "threshold-min-pairs", "threshold-band", "dp-noise-multiplier", "dp-clipping-norm",
    "secure-aggregation",  # on, it turns off the server's screening of each update
    "secure-upload-mb",  # under SecAgg+, how much of each update is summed
})
# What only the operator's signed app may set: a run overriding any is refused.
SIGNED_KEYS = DEVICE_KEYS | SHAPING_KEYS
T = TypeVar("T", int, float, str)

_NAMES = {int: "an integer", float: "a number", str: "a string"}


def read(config: RunConfig, key: str, kind: type[T],
         check: tuple[Callable[[T], bool], str] | None = None) -> T:
    """``config[key]`` as ``kind``; ``check`` is a test and what it asks for, e.g.
    ``(lambda v: v >= 0, ">= 0")``. Raises RunConfigError naming the key."""
    if key not in config:
        raise RunConfigError(f"the run config has no '{key}': the run was started with "
                             "another meancache version's Flower app")
    value = config[key]
    # bool is an int in Python, and an int is a fine float ("round-timeout=300").
    fits = not isinstance(value, bool) and (
        isinstance(value, kind) or (kind is float and isinstance(value, int)))
    if not fits:
        raise RunConfigError(f"run config '{key}' must be {_NAMES[kind]}, not {value!r}")
    typed = kind(value)
    if check is not None and not check[0](typed):
        raise RunConfigError(f"run config '{key}' must be {check[1]}, not {value!r}")
    return typed


def read_path(config: RunConfig, key: str) -> Path | None:
    """A path, where the empty string (the app's default) means none."""
    value = read(config, key, str)
    return Path(value) if value else None


def at_least(bound: float) -> tuple[Callable[[float], bool], str]:
    return (lambda value: value >= bound, f">= {bound:g}")


def positive() -> tuple[Callable[[float], bool], str]:
    return (lambda value: value > 0, "> 0")


def share() -> tuple[Callable[[float], bool], str]:
    return (lambda value: 0.0 <= value <= 1.0, "between 0 and 1")


def one_of(*choices: str) -> tuple[Callable[[str], bool], str]:
    return (lambda value: value in choices, "one of " + ", ".join(map(repr, choices)))


@dataclass(frozen=True)
class ModelConfig:
    """What the ServerApp and the ClientApp must agree on: the base encoder, which of its
    layers travel, and the seed."""

    encoder_model: str | None  # None: the packaged MiniLM
    top_layers: int  # 0: every layer
    seed: int
    verifier_layers: int  # the verifier's top layers trained (and its head); 0: not federated
    verifier_dir: Path | None  # its int8 base (verifier.onnx and card); None: the shipped one
    # False: the encoder is not federated (the verifier alone is): no encoder tensor
    # travels, and every device keeps the base model's vector space
    train_encoder: bool = True

    @classmethod
    def from_run_config(cls, config: RunConfig) -> "ModelConfig":
        model = cls(encoder_model=read(config, "encoder-model", str) or None,
                    top_layers=read(config, "top-layers", int, at_least(0)),
                    seed=read(config, "seed", int),
                    verifier_layers=read(config, "verifier-top-layers", int, at_least(0)),
                    verifier_dir=read_path(config, "verifier-model"),
                    train_encoder=read(config, "train-encoder", int,
                                       (lambda v: v in (0, 1), "0 or 1")) == 1)
        if not model.train_encoder and model.verifier_layers == 0:
            raise RunConfigError("run config 'train-encoder' = 0 needs "
                                 "'verifier-top-layers' > 0: else nothing is trained")
        return model


def read_update_rank(config: RunConfig) -> int:
    """update-rank: the rank of the factors a device sends of each trained matrix's
    update (shared.fl.low_rank; 0: every value), which is also the highest rank the server
    decodes. Both sides read it here, so they cannot disagree."""
    return read(config, "update-rank", int, at_least(0))
