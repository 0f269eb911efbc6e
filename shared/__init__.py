"""Code that the client, the FL server and the upstream must agree on."""

import meancache.shared.offline  # noqa: F401  (first: no Hugging Face download is ever attempted)
