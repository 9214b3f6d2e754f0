"""Engine adapters: the only code that knows an engine's internals.

Installed as the package ``kvpolicy.adapters``.
"""
