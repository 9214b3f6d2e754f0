"""The kvpolicy grammar, shipped as package data of the package ``kvpolicy.grammar``.

Imported under any other name (``grammar``, from the repository root) the import is refused:
the grammar has one identity, ``kvpolicy.grammar``.
"""

if __name__ != "kvpolicy.grammar":
    raise ImportError(
        f"the kvpolicy grammar is the package kvpolicy.grammar; import it as kvpolicy.grammar, not {__name__}",
        name=__name__,
    )
