"""Support shared by the test suites: stand-ins for what a test cannot have, and helpers."""
