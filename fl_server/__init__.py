"""Flower ServerApp: FedAvg of embedding weights and thresholds (see issue: federated learning)."""
