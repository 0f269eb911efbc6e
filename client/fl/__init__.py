"""The device's side of federated learning: its local data, local training and the
Flower ClientApp. Only weights, a threshold and counts ever leave the device."""
