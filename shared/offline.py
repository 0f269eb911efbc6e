"""Import before transformers or sentence-transformers: nothing is ever downloaded here
(no hub at run time), so the libraries must not try."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
