"""kvpolicy lsp: the language server for policy files (docs/editors.md)."""
