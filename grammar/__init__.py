"""The kvpolicy grammar, shipped as package data (kvpolicy.grammar)."""
