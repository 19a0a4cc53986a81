"""``python -m cct train ...``: the ``cct`` command."""
from .cli import main

raise SystemExit(main())
