"""The differential check against upstream llama-cpp-python 0.3.36 (``nox -s differential``).

:mod:`.upstream` builds upstream's wheel from the sdist the lock pins (cached by content);
:mod:`.calls` is the script both packages run, one process each (both import as ``llama_cpp``);
:mod:`.compare` compares their JSON results against the documented differences.
"""
