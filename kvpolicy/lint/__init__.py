"""Checks for policy files: one check per catalogue rule of the check phase, suppressions, and the linter that runs them."""
