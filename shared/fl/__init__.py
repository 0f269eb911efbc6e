"""What the FL server and the devices agree on: which weights travel, and the global
model's checkpoint format (the same files a device downloads)."""
