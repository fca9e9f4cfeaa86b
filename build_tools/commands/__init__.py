"""One module per ``python -m build_tools`` subcommand (and nox session)."""
