"""Engine adapters: the only code that knows an engine's internals (SGLang DeepSeek-V4, vLLM).

This folder is the package ``kvpolicy.adapters`` (pyproject's ``package-dir``; an
editable install maps it the same way). Imported under any other name — ``adapters``,
when the repository root is on ``sys.path`` — it would be a second copy of every
module, with its own state and its own classes, so that import is refused.
"""

if __name__ != "kvpolicy.adapters":
    raise ImportError(
        f"the engine adapters are the package kvpolicy.adapters; import them as kvpolicy.adapters, not {__name__} "
        "(install kvpolicy, e.g. pip install -e ., rather than importing the folder from the repository root)",
        name=__name__,
    )
