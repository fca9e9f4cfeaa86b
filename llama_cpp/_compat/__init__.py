"""llama-cpp-python compatibility helpers: token hooks, hub download, state."""
