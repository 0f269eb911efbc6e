"""Code that the client, the FL server and the upstream must agree on."""
