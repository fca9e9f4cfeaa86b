"""Stage 2, native: a vendored tree + one configuration → a finished native build in the cache.

Input: a :class:`~build_tools.inputs.configs.BuildConfig` and the vendored tree. Output: a
:class:`~build_tools.stages.native.build.NativeBuild` whose ``native-manifest.json``
(:class:`~build_tools.stages.native.manifest.NativeManifest`: the libraries' names, sizes and
hashes) the wheels and validate stages take. Writes ``<cache>/native/<config>-<key16>/``;
``cuda_toolkit``/``cuda_stub`` provision the CUDA toolkit a CUDA configuration compiles with.
"""
