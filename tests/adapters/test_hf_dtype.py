"""The dtype names the plans read are torch's (the engine tests hold the rest of ``hf_dtype`` to each engine)."""

from __future__ import annotations

from kvpolicy.adapters.hf_dtype import TORCH_DTYPE_NAMES, dtype_key, dtype_problem
from kvpolicy.document_codes import VALUE_NOT_ALLOWED, WRONG_TYPE
from tests.support.dtype_values import DTYPE_NAMES


def test_the_names_are_those_of_torchs_dtypes():
    assert set(DTYPE_NAMES) == TORCH_DTYPE_NAMES


def test_transformers_reads_dtype_before_torch_dtype():
    assert dtype_key({"dtype": "float16", "torch_dtype": "x"}) == "dtype"
    assert dtype_key({"dtype": None, "torch_dtype": "x"}) == "torch_dtype"
    assert dtype_key({"torch_dtype": None}) is None
    assert dtype_problem({"dtype": "float16", "torch_dtype": "x"}) is None


def test_a_value_that_names_no_dtype_is_refused_at_its_key():
    problem = dtype_problem({"dtype": None, "torch_dtype": "bf16"})
    assert problem is not None and (problem.key, problem.code, problem.message) == (
        "torch_dtype", VALUE_NOT_ALLOWED, "torch_dtype 'bf16' is not a torch dtype")
    problem = dtype_problem({"dtype": 5})
    assert problem is not None and (problem.key, problem.code) == ("dtype", WRONG_TYPE)
