"""The release pipeline stages, in order; each takes the previous one's typed result.

1. ``vendor``   lock → :class:`~build_tools.stages.vendor.VendoredTree` (``vendor/llama.cpp``)
2. ``native``   config + tree → :class:`~build_tools.stages.native.build.NativeBuild` (the cache)
3. ``wheels``   native build → :class:`~build_tools.stages.wheels.BuiltWheel` list (``dist/<config>/``)
4. ``validate`` wheels + native manifest → :class:`~build_tools.stages.validate.ValidationReport`
5. ``smoke``    wheels × interpreters → :class:`~build_tools.stages.smoke.SmokeReport`
6. ``publish``  cleared ``dist/<config>/`` folders → the PEP 503 index

The gate between 5 and 6 (which files are cleared for publishing) is :mod:`build_tools.dist`;
the chain that composes them is :mod:`build_tools.release`.
"""
