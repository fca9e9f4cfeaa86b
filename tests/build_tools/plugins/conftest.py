"""The plugin tests' local package index."""

from .plugin_index import sdist_file, serve_index  # noqa: F401 - fixtures
