"""Logging goes to a file under the data dir, never to the terminal the user works in."""

import logging
import logging.handlers
from pathlib import Path

# Libraries that log every export pass or weight load at INFO: useful only when debugging.
_CHATTY = ("onnxscript", "onnx_ir", "torch.onnx", "sentence_transformers", "httpx",
           "transformers", "urllib3")


def setup_logging(log_file: Path, level: str = "INFO") -> None:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(
        log_file, maxBytes=5 * 1024 * 1024, backupCount=3, encoding="utf-8"
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.captureWarnings(True)
