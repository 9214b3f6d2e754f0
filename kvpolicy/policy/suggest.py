"""The language's did-you-mean suggestions: the base layer's (``kvpolicy.suggest``), where the
commands and the facts schema find them too."""

from kvpolicy.suggest import closest, did_you_mean

__all__ = ["closest", "did_you_mean"]
