"""Core objects over the native library (model, context, sampler, batches, state helpers)."""
