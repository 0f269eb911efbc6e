"""`python -m meancache` is the `meancache` command."""

from meancache.cli import main

raise SystemExit(main())
