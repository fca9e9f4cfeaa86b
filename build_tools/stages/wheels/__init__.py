"""Stage 3, wheels: a finished native build → one wheel per CPython tag (or one py3 wheel).

Input: a :class:`~build_tools.stages.native.build.NativeBuild`. Output: the
:class:`BuiltWheel` list recorded in ``dist/<config>/wheels.json`` (the wheels *record*).
``build`` assembles the archives (through ``inwheel``, deterministically), ``sbom`` writes their
CycloneDX SBOM, ``repair`` retags them with auditwheel.
"""

from .build import PYTHON_TAGS, BuiltWheel, WheelOptions, load_record

__all__ = ["PYTHON_TAGS", "BuiltWheel", "WheelOptions", "load_record"]
