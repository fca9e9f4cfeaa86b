"""Chat formats: the format table, Jinja2 formatter, handler, tool calling, types and vision handlers."""
