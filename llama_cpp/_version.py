"""The single version source of the llama-cpp-python distribution.

``0.3.36.N``: the first three components are the upstream llama-cpp-python release whose API this
package implements (the sdist ``manifests/llama.cpp.lock.json`` pins); ``N`` counts this package's
releases on that line. So a library pinned to ``llama-cpp-python<0.4`` or ``~=0.3.36`` keeps this
wheel (see docs/compatibility.md, "Versions").
"""

__version__ = "0.3.36.1"
