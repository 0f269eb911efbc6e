"""The ClientApp's settings, read from each message's run config (defaults: the Flower
app's ``[tool.flwr.app.config]``). In shared because the server side checks them too:
`fl sign-app` and `fl run` refuse an app whose devices would fail every round."""

from dataclasses import dataclass
from pathlib import Path

from meancache.shared.errors import RunConfigError
from meancache.shared.fl.compression import BITS
from meancache.shared.fl.run_config import (
    ModelConfig,
    RunConfig,
    at_least,
    one_of,
    positive,
    read,
    read_path,
    read_update_rank,
)


@dataclass(frozen=True)
class TrainConfig:
    """Local training's settings (client.fl.train)."""

    epochs: int
    batch_size: int
    learning_rate: float
    top_layers: int  # 0: train (and send) every layer
    seed: int


@dataclass(frozen=True)
class ClientConfig:
    model: ModelConfig
    train: TrainConfig
    min_pairs: int  # fewer labelled pairs than this: the device sits the round out
    data_source: str  # "device": the user's feedback; "qqp": a partition (simulation)
    qqp_path: Path | None
    partitioning: str
    pairs_per_client: int
    cache_dir: Path | None
    update_bits: int  # 0: float32 weights; 8 or 4: the quantised update (shared.fl.compression)
    update_rank: int  # > 0: each matrix's update as rank-r factors (with update_bits 8 or 4)

    @classmethod
    def from_run_config(cls, config: RunConfig) -> "ClientConfig":
        model = ModelConfig.from_run_config(config)
        data_source = read(config, "data-source", str, one_of("device", "qqp"))
        qqp_path = read_path(config, "qqp-path")
        if data_source == "qqp" and qqp_path is None:
            raise RunConfigError("run config 'qqp-path' must name a labelled-pairs file "
                                 "when 'data-source' is 'qqp'")
        return cls(
            model=model,
            train=TrainConfig(
                epochs=read(config, "epochs", int, at_least(1)),
                batch_size=read(config, "batch-size", int, at_least(1)),
                learning_rate=read(config, "learning-rate", float, positive()),
                top_layers=model.top_layers,
                seed=model.seed,
            ),
            min_pairs=read(config, "min-pairs", int, at_least(0)),
            data_source=data_source,
            qqp_path=qqp_path,
            partitioning=read(config, "partitioning", str, one_of("iid", "topic")),
            pairs_per_client=read(config, "pairs-per-client", int, at_least(1)),
            cache_dir=read_path(config, "cache-dir"),
            update_bits=read(config, "update-bits", int,
                             (lambda v: v in (0, *BITS), "0, 8 or 4")),
            update_rank=read_update_rank(config),
        )
