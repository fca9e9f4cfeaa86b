"""The single version source of the llama-cpp-python distribution."""

__version__ = "0.4.0"
