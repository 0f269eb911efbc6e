"""Import before transformers or sentence-transformers: nothing is ever downloaded here
(no hub at run time), so the libraries must not try; and they draw no progress bars of
their own on the terminal (meancache reports its own steps, and the chat's screen is not
theirs to write on)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
