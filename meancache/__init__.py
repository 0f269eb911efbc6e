"""meancache: an on-device cache for LLM chat, trained by federated learning.

The four sides are installed as one namespace from the folders of the same names:
``meancache.shared`` (what every side agrees on), and above it ``meancache.client``,
``meancache.upstream`` and ``meancache.fl_server``, which never import each other. The
modules here, at the top, are the only ones that join them (the ``meancache`` command).
See docs/architecture.md.
"""
