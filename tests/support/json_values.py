"""Random JSON values of every kind, for checking what a config class takes field by field."""

from __future__ import annotations

from hypothesis import strategies as st

JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 4096), st.floats(-10, 1e6, allow_nan=False),
    st.integers(0, 64).map(float),  # a float with a whole value: 10.0
    st.text(max_size=6), st.lists(st.integers(0, 9), max_size=3), st.lists(st.text(max_size=3), max_size=3),
    st.lists(st.one_of(st.integers(0, 9), st.text(max_size=2)), min_size=2, max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2),
)
"""null, true/false, integers, floats (whole ones too), strings, lists of numbers, of strings and of both,
objects."""
