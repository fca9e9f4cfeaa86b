"""The smoke stage (build_tools.stages.smoke): its workload registry and comparisons, the GPU bundle, the
report, real venvs, and the emulated arm64 userlands."""
