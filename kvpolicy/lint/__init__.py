"""Checks for policy files: the rule registry, the rules, and the linter that runs them."""
