"""The smoke stage without wheels: the workload registry, its comparisons, the GPU bundle files."""
