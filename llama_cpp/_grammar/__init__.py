"""Grammar helpers: JSON schema to GBNF."""
