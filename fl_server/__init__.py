"""Flower ServerApp: FedAvg of embedding weights and thresholds, checkpoints, serving."""

import meancache.shared  # noqa: F401  (sets the offline environment before any Hugging Face import)
