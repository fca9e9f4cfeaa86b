"""Native plumbing: library loading, ctypes helpers, CUDA runtime preload, DLL search, binary
formats (ELF/PE/Mach-O) and routing of native logs into :mod:`logging`. Imports nothing above it."""
