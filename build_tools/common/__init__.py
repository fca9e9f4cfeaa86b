"""Plumbing every stage uses, one place each: paths, files, hashing, interpreters, compilers, ELF."""
