"""The ServerApp's settings, read once from the run config (defaults: the Flower app's
``[tool.flwr.app.config]``), and the operator's ``--run-config`` split into what devices
read or that shapes what they receive (written into the signed app) and the server's
scheduling of a run (its overrides)."""

from dataclasses import dataclass
from pathlib import Path

from meancache.fl_server.app_declaration import default_run_config
from meancache.fl_server.pooled_threshold import ThresholdRule
from meancache.fl_server.screening import ReplyLimits
from meancache.shared.errors import RunConfigError
from meancache.shared.fl.run_config import (
    SIGNED_KEYS,
    ModelConfig,
    RunConfig,
    at_least,
    one_of,
    positive,
    read,
    read_path,
    read_update_rank,
    share,
)

# How the strategy (fl_server.strategy) averages the updates: the weighted mean, or the
# coordinate-wise median. Defined here, so that reading a run config (every `fl` command
# does) imports no torch.
AGGREGATIONS = ("fedavg", "median")


@dataclass(frozen=True)
class ServerConfig:
    model: ModelConfig
    num_server_rounds: int
    min_available_nodes: int
    min_train_nodes: int
    fraction_train: float
    fraction_evaluate: float
    min_evaluate_nodes: int
    round_timeout: float
    checkpoint_dir: Path
    limits: ReplyLimits
    threshold_rule: ThresholdRule
    aggregation: str  # "fedavg" or "median"
    dp_noise_multiplier: float  # 0: no central differential privacy
    dp_clipping_norm: float
    dp_delta: float
    held_out_path: Path | None  # None: the global models are not scored
    held_out_pairs: int
    secure_aggregation: bool  # SecAgg+ (fl_server.secure_rounds): the server sees only sums
    secure_upload_mb: float  # under SecAgg+, the cap on a device's masked weights, MB (0: none)
    evidence_round: bool  # after the last round (fl_server.evidence_round; SecAgg+ too)

    @property
    def models_dir(self) -> Path:
        """The server's own copy of an assembled MPNet, beside its checkpoints."""
        return self.checkpoint_dir.parent / "models"

    @classmethod
    def from_run_config(cls, config: RunConfig) -> "ServerConfig":
        checkpoint_dir = read_path(config, "checkpoint-dir")
        if checkpoint_dir is None:
            raise RunConfigError("run config 'checkpoint-dir' must name where the global "
                                 "models go (`meancache fl run` sets it)")
        return cls(
            model=ModelConfig.from_run_config(config),
            num_server_rounds=read(config, "num-server-rounds", int, at_least(1)),
            min_available_nodes=read(config, "min-available-nodes", int, at_least(1)),
            min_train_nodes=read(config, "min-train-nodes", int, at_least(1)),
            fraction_train=read(config, "fraction-train", float, share()),
            fraction_evaluate=read(config, "fraction-evaluate", float, share()),
            min_evaluate_nodes=read(config, "min-evaluate-nodes", int, at_least(0)),
            round_timeout=read(config, "round-timeout", float, at_least(1)),
            checkpoint_dir=checkpoint_dir,
            limits=ReplyLimits(
                max_examples=read(config, "max-examples", int, at_least(1)),
                max_update_norm=read(config, "max-update-norm", float, positive()),
                max_update_rank=read_update_rank(config),
            ),
            threshold_rule=ThresholdRule(
                prior_pairs=read(config, "threshold-prior-pairs", int, at_least(0)),
                min_pairs=read(config, "threshold-min-pairs", int, at_least(1)),
                max_step=read(config, "threshold-band", float, share()),
            ),
            aggregation=read(config, "aggregation", str, one_of(*AGGREGATIONS)),
            dp_noise_multiplier=read(config, "dp-noise-multiplier", float, at_least(0)),
            dp_clipping_norm=_dp_clipping_norm(config),
            dp_delta=read(config, "dp-delta", float, (lambda v: 0 < v < 1, "between 0 and 1")),
            held_out_path=read_path(config, "held-out-path"),
            held_out_pairs=read(config, "held-out-pairs", int, at_least(0)),
            secure_aggregation=_secure(config),
            secure_upload_mb=read(config, "secure-upload-mb", float, at_least(0)),
            evidence_round=read(config, "evidence-round", int,
                                (lambda v: v in (0, 1), "0 or 1")) == 1,
        )


def _dp_clipping_norm(config: RunConfig) -> float:
    """With DP on, the noise is a multiple of the clipping norm: 0 would be no noise."""
    norm = read(config, "dp-clipping-norm", float, at_least(0))
    if norm == 0 and read(config, "dp-noise-multiplier", float) > 0:
        raise RunConfigError("run config 'dp-clipping-norm' must be > 0 with central DP "
                             "('dp-noise-multiplier' > 0)")
    return norm


def _secure(config: RunConfig) -> bool:
    """SecAgg+ hides each update, so what needs one (the median) cannot run beside it:
    refused by name rather than silently dropped. Central DP runs beside it with
    client-side clipping only (fl_server.privacy.SecureSumDP)."""
    secure = read(config, "secure-aggregation", int, (lambda v: v in (0, 1), "0 or 1")) == 1
    if secure and read(config, "aggregation", str) != "fedavg":
        raise RunConfigError("run config 'secure-aggregation' = 1 needs 'aggregation' = "
                             "'fedavg': the server sees only the sum of the updates")
    return secure


Values = dict[str, bool | int | float | str]


def parse_overrides(text: str | None) -> Values:
    """``--run-config "key=value ..."`` read as `flwr run` reads it; a key the app does
    not have is refused by name."""
    import click
    from flwr.common.config import parse_config_args

    try:
        config: Values = parse_config_args([text]) if text else {}
    except OSError as exc:  # a .toml file's name
        raise RunConfigError(f"--run-config: cannot read {text}: {exc.strerror}") from None
    except (click.ClickException, ValueError) as exc:
        message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        raise RunConfigError(f"--run-config {text!r}: {message}") from None
    # Flower's reading drops what is not key=value ("epochs", "epochs=") without a word:
    # every word must have become a key (a .toml file's name is the one word that is not)
    words = [] if (text or "").endswith(".toml") else _words(text or "")
    for word in words:
        if word.partition("=")[0] not in config:
            raise RunConfigError(f"--run-config: {word[:40]!r} is not key=value (e.g. "
                                 "epochs=2 aggregation='median'); nothing was run or signed")
    unknown = sorted(set(config) - set(default_run_config()))
    if unknown:
        raise RunConfigError(f"--run-config: the app has no key {', '.join(unknown)} (the "
                             "keys: [tool.flwr.app.config] in "
                             "meancache/fl_server/flower_app/pyproject.toml)")
    return config


def _words(text: str) -> list[str]:
    """The run config's words as a shell would split them (quotes keep a value whole)."""
    import shlex

    try:
        return shlex.split(text)
    except ValueError as exc:  # an unclosed quote
        raise RunConfigError(f"--run-config {text[:80]!r}: {exc}") from None


def split_overrides(config: Values) -> tuple[Values, Values]:
    """(what devices read or receive: signed into the app (SIGNED_KEYS), the server's
    scheduling of the run: overrides)."""
    signed = {k: v for k, v in config.items() if k in SIGNED_KEYS}
    return signed, {k: v for k, v in config.items() if k not in SIGNED_KEYS}
