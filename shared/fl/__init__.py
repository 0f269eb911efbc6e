"""What the FL server and the devices agree on: which weights travel, the global model's
checkpoint format (the same files a device downloads), and how a run's config is read."""
