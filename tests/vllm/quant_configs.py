"""Random checkpoint quantization configs, as config.json's ``quantization_config`` (or hf_quant_config.json)
writes them, for the tests of ``planning/kv_dtype.py`` against vLLM 0.33 (tests/vllm) and 0.32 (tests/vllm_e2e).

``kv_quant_configs`` draws what vLLM's KV dtype resolution reads, valid or not: ModelOpt (flat, nested under
``quantization``, named by its producer instead of ``quant_method``), compressed-tensors, other methods, with KV
algorithms in random case (fp8, nvfp4, names vLLM does not know), KV scheme dicts, empty and odd values.
``planned_quant_configs`` draws the ones a vLLM model builds with on this CPU (weights vLLM's CPU kernels take),
for the end-to-end plans.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

ABSENT = object()
"""A key the config leaves out."""


def random_case(word: str) -> st.SearchStrategy[str]:
    """``word`` with each letter in upper or lower case at random."""
    return st.lists(st.booleans(), min_size=len(word), max_size=len(word)).map(
        lambda ups: "".join(c.upper() if up else c.lower() for c, up in zip(word, ups)))


KV_ALGO_NAMES = ["fp8", "nvfp4", "int8", "fp8_e5m2", "fp8_e4m3", "auto", "nvfp4_kv"]
"""Known (fp8, nvfp4) and unknown KV algorithm names; drawn in random case."""


def kv_algo() -> st.SearchStrategy[Any]:
    """A ``kv_cache_quant_algo`` value: a name in random case mostly; empty, null or of another type at times."""
    return st.one_of(
        st.sampled_from(KV_ALGO_NAMES).flatmap(random_case),
        st.sampled_from(["", None, 8, True, ["fp8"]]),
    )


@st.composite
def kv_scheme(draw: st.DrawFn) -> Any:
    """A KV scheme dict (compressed-tensors' and ModelOpt's ``kv_cache_scheme``): random bits, type, dynamic,
    strategy and symmetry, each possibly absent; empty at times."""
    if draw(st.integers(0, 9)) == 0:
        return {}
    scheme: dict[str, Any] = {}
    for key, values in (("num_bits", [8, 8, 8, 4, 4, 16, 8.0]), ("type", ["float", "float", "float", "int"]),
                        ("dynamic", [False, False, True, 0, None]),
                        ("strategy", ["tensor", "tensor", "attn_head", "channel", "token", "per_tensor"]),
                        ("symmetric", [True, True, True, False])):
        if draw(st.integers(0, 5)):
            scheme[key] = draw(st.sampled_from(values))
    return scheme


def put(config: dict[str, Any], key: str, value: Any) -> None:
    if value is not ABSENT:
        config[key] = value


@st.composite
def modelopt(draw: st.DrawFn) -> dict[str, Any]:
    """A ModelOpt config: flat (config.json, ModelOpt 0.31 and after), nested under ``quantization``
    (hf_quant_config.json), or both; ``quant_method`` in random case, or only a ``producer`` naming ModelOpt."""
    config: dict[str, Any] = {}
    if draw(st.integers(0, 3)):
        config["quant_method"] = draw(st.sampled_from(["modelopt", "modelopt_fp4", "modelopt"]).flatmap(random_case))
    layout = draw(st.sampled_from(["flat", "nested", "nested", "both"]))
    algo = st.sampled_from(["FP8", "FP8", "fp8", "NVFP4", "FP8_PB_WO", "MIXED_PRECISION", "W4A8_AWQ"])
    kv_fields = st.sampled_from([ABSENT, ABSENT]) | kv_algo()
    scheme_fields = st.sampled_from([ABSENT, ABSENT, ABSENT, None]) | kv_scheme()
    if layout != "nested":
        put(config, "quant_algo", draw(algo))
        put(config, "kv_cache_quant_algo", draw(kv_fields))
        put(config, "kv_cache_scheme", draw(scheme_fields))
    if layout != "flat":
        inner: dict[str, Any] = {}
        put(inner, "quant_algo", draw(st.sampled_from([ABSENT]) | algo))
        put(inner, "kv_cache_quant_algo", draw(kv_fields))
        put(inner, "kv_cache_scheme", draw(scheme_fields))
        config["quantization"] = inner
    if "quant_method" not in config or draw(st.booleans()):
        config["producer"] = {"name": "modelopt", "version": "0.29.0"}
    if draw(st.integers(0, 19)) == 0:  # what vLLM cannot read: a nested part or a producer that is no object
        config[draw(st.sampled_from(["quantization", "producer"]))] = draw(st.sampled_from([None, "fp8", ["FP8"]]))
    return config


@st.composite
def compressed_tensors(draw: st.DrawFn) -> dict[str, Any]:
    """A compressed-tensors (llm-compressor) config with no quantized weights, with or without a KV scheme."""
    config: dict[str, Any] = {
        "quant_method": draw(st.sampled_from(["compressed-tensors", "compressed-tensors", "compressed_tensors",
                                              "Compressed-Tensors"])),
        "format": "float-quantized", "config_groups": {}, "ignore": ["lm_head"],
    }
    put(config, "kv_cache_scheme", draw(st.sampled_from([ABSENT, None]) | kv_scheme()))
    return config


@st.composite
def kv_quant_configs(draw: st.DrawFn) -> dict[str, Any] | None:
    """A checkpoint's quantization config as vLLM's KV dtype resolution may meet it (None: not quantized)."""
    kind = draw(st.sampled_from(["modelopt", "modelopt", "modelopt", "compressed-tensors", "other", "none"]))
    if kind == "modelopt":
        return draw(modelopt())
    if kind == "compressed-tensors":
        return draw(compressed_tensors())
    if kind == "other":  # methods that leave the KV cache alone, whatever KV keys they carry
        config = {"quant_method": draw(st.sampled_from(["fp8", "awq", "gptq", "", "quark", None]))}
        put(config, "kv_cache_quant_algo", draw(st.sampled_from([ABSENT]) | kv_algo()))
        return config
    return None


FP8_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


PLANNED_KINDS = {"modelopt": ["modelopt"], "compressed-tensors": ["compressed-tensors"],
                 "other": ["fp8", "quark", "none"]}
"""The groups of ``planned_quant_configs``' kinds, each drawn as often as the others where a test takes them in
turn."""


@st.composite
def planned_quant_configs(draw: st.DrawFn, kinds: list[str]) -> tuple[str, dict[str, Any] | None]:
    """(kind, config) of a checkpoint of one of ``kinds`` that vLLM builds on this CPU: ModelOpt FP8 weights (per
    tensor) with KV algorithms and schemes in both layouts; compressed-tensors with unquantized weights and a
    valid, invalid or no KV scheme; Fp8Config and Quark FP8 per-tensor weights; or none."""
    kind = draw(st.sampled_from(kinds))
    if kind == "modelopt":
        # Mostly fp8 (the checkpoints NVIDIA publishes), else nvfp4, names vLLM does not know, or none.
        names = st.sampled_from(["fp8", "fp8", "fp8", "nvfp4", "int8", "fp8_e5m2", ""])
        kv = names.flatmap(lambda name: random_case(name) if name else st.just(ABSENT))
        if draw(st.booleans()):
            config: dict[str, Any] = {"quant_method": draw(random_case("modelopt")), "quant_algo": "FP8"}
            put(config, "kv_cache_quant_algo", draw(kv))
            if draw(st.integers(0, 2)) == 0:
                config["kv_cache_scheme"] = draw(st.sampled_from([FP8_SCHEME]) | kv_scheme())
        else:
            inner: dict[str, Any] = {"quant_algo": "FP8"}
            put(inner, "kv_cache_quant_algo", draw(kv))
            config = {"producer": {"name": "modelopt", "version": "0.29.0"}, "quantization": inner}
        return kind, config
    if kind == "compressed-tensors":
        config = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {},
                  "ignore": ["lm_head"]}
        put(config, "kv_cache_scheme", draw(st.sampled_from([ABSENT, FP8_SCHEME, FP8_SCHEME]) | kv_scheme()))
        return kind, config
    if kind == "fp8":
        return kind, {"quant_method": "fp8", "activation_scheme": "dynamic"}
    if kind == "quark":
        fp8 = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False, "symmetric": True}
        return kind, {"quant_method": "quark", "export": {"kv_cache_group": []},
                      "global_quant_config": {"weight": fp8, "input_tensors": fp8, "output_tensors": None},
                      "layer_quant_config": {}, "layer_type_quant_config": {}, "exclude": ["lm_head"]}
    return kind, None
