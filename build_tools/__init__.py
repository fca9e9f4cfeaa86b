"""Release orchestration for llama-cpp-python.

Data flows one way: configs → vendor → native → wheels → validate → smoke → publish.
Each step is a function taking the previous step's typed result; ``noxfile.py`` only
parses arguments and calls into these modules.
"""

RECIPE_VERSION = "3"  # 3: paths mapped out of the binaries; ggml names the locked commit
"""Bump when the native build recipe changes in a way the content key cannot see."""
