"""``python3 -I -m hostagent.hooks VERB ...``: how CDI specs run the hook program."""

from .main import main

raise SystemExit(main())
