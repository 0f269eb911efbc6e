"""What several test modules share: servers on loopback, a tiny encoder, the
chat app under Pilot, federated-learning fixtures and the repository's paths."""
