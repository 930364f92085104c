"""Sub-commands of the ``dare`` CLI (one module each: ``HELP``, ``configure``, ``run``)."""
