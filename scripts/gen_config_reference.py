"""Write docs/reference/configuration.md from the settings models (one table per side:
key, type, default, environment variable, description), so the reference cannot drift
from the code; tests/test_config_reference.py fails when the committed file is stale.

    .venv/bin/python scripts/gen_config_reference.py [--check]
"""

import argparse
import sys
from pathlib import Path

from meancache.shared.settings_reference import reference_markdown

from meancache.cli import SIDES

TARGET = Path(__file__).resolve().parents[1] / "docs" / "reference" / "configuration.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the file differs from what would be written")
    args = parser.parse_args()
    text = reference_markdown(SIDES)
    if args.check:
        stale = not TARGET.is_file() or TARGET.read_text(encoding="utf-8") != text
        if stale:
            print(f"{TARGET} is out of date: run scripts/gen_config_reference.py",
                  file=sys.stderr)
        return int(stale)
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
