"""Shared helper of the CLI tests: a user's mistake ends in exactly one ``error: ...`` line and exit status 2."""

from dare.cli import main


def one_line_error(capsys, *args) -> str:
    """Run ``dare ARGS`` in-process; assert exit status 2 and one ``error:`` line on stderr; return that line."""
    assert main([str(a) for a in args]) == 2, args
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]
