"""``python -m dare ...``: the ``dare`` command (:func:`dare.cli.main`)."""

from dare.cli import main

raise SystemExit(main())
