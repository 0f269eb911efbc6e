"""Commands that need no model start fast: they never import torch, transformers,
sentence-transformers or onnxruntime (importing torch alone takes seconds)."""

import json
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "transformers", "sentence_transformers", "onnxruntime")

# Runs each command's main() in turn in one fresh interpreter (imports only accumulate, so
# the first command that imports a heavy module is the one named), printing after each
# its exit code and the heavy modules imported so far.
PROBE = """
import contextlib, io, json, sys
from meancache.cli import main
for command in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(command)
        except SystemExit as exc:
            code = exc.code
    print(" ".join(command), "->", code, *[n for n in {heavy!r} if n in sys.modules])
"""

LIGHT_COMMANDS = [
    ["--help"],
    ["cache", "stats"],
    ["cache", "stats", "--json"],
    ["cache", "list"],
    ["upstream", "--help"],
    ["upstream", "serve", "--help"],
    ["fl", "--help"],
    ["fl", "join", "--help"],
    ["fl", "sync", "--help"],
    ["fl", "simulate", "--help"],
    ["fl", "server", "--help"],
    ["fl", "run", "--help"],
]


def test_commands_without_a_model_import_no_model_library(tmp_path: Path) -> None:
    """One interpreter for all of them: each start costs about 1.3 CPU-s."""
    env = {"MEANCACHE_DATA_DIR": str(tmp_path / "data"),
           "MEANCACHE_CONFIG_DIR": str(tmp_path / "config"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY),
                             json.dumps(LIGHT_COMMANDS)],
                            env=env, capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.splitlines() == [f"{' '.join(c)} -> 0" for c in LIGHT_COMMANDS], (
        result.stdout + result.stderr)


def test_an_exact_pack_hit_is_answered_before_any_model_loads(tmp_path: Path) -> None:
    """`meancache ask` with the very question of the pack: a hash lookup, answered and
    saved without importing a model library or asking the upstream (none listens)."""
    from meancache.client.chat.conversations import ConversationStore
    from meancache.client.pack.store import PACK_FILE
    from meancache.shared.pack import write_pack
    from meancache.shared.processes import free_port

    data = tmp_path / "data"
    write_pack(data / "packs" / PACK_FILE, [("What is Python?", "A programming language.")],
               model="builtin:tiny", sigma=4.0)
    env = {"MEANCACHE_DATA_DIR": str(data), "MEANCACHE_CONFIG_DIR": str(tmp_path / "config"),
           "PATH": "/usr/bin:/bin"}
    ask = ["ask", "what is python", "--upstream", f"http://127.0.0.1:{free_port()}"]
    result = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY),
                             json.dumps([ask])],
                            env=env, capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.splitlines() == [f"{' '.join(ask)} -> 0"], (
        result.stdout + result.stderr)
    [saved] = ConversationStore(data / "conversations").list()
    assert [(t.question, t.answer, str(t.source)) for t in saved.turns] == [
        ("what is python", "A programming language.", "pack")]


def test_the_chat_app_draws_before_any_model_library_loads() -> None:
    """The app's own module is light: its start screen is drawn before the worker loads
    the cache, the encoder's runtime and torch (a new user saw nothing for 6 to 13 s)."""
    probe = (f"import sys; from meancache.client.tui.app import MeanCacheApp; "
             f"print(*[name for name in {HEAVY!r} if name in sys.modules])")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.split() == [], result.stdout + result.stderr
