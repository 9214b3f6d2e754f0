"""The launches vLLM refuses because a model dimension does not fit its tensor parallel size.

vLLM checks one dimension when it builds its config (``ModelConfig.verify_with_parallel_config``):
the attention heads, which the tensor parallel size must divide. The others it checks while each
worker builds the model, at start-up (before a weight is loaded), module by module in the order the
model class builds them (vLLM 0.32 and 0.33 alike):

1. the embedding, ``VocabParallelEmbedding``: the vocabulary padded to a multiple of 64 must divide
   evenly across the ranks (``vocab_range_from_global_vocab_size`` → ``divide``; the LM head is the same);
2. layer by layer, the attention of standard models: the ranks split the KV heads, or replicate them,
   so the size must divide them or be a multiple of them (the model's attention class, and
   ``QKVParallelLinear``); then each rank's heads must be a multiple of its KV heads (``Attention``);
3. then the layer's MLP: a dense MLP's ``intermediate_size`` (``MergedColumnParallelLinear``); an MoE
   layer's shared experts, ``moe_intermediate_size × n_shared_experts`` (an MLP of that width), and its
   experts' ``moe_intermediate_size`` (``FusedMoEConfig``); gpt-oss's experts' ``intermediate_size``.

Which MLP each layer has is the model class's (``class_defaults``: ``ConfigClass.mlp``); for a model
type the table does not know, only the embedding and the attention are checked. DeepSeek-V4's other
dimensions (its experts, grouped output projection) are not checked here: its CUDA and CPU model
classes split them differently. Pure code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from kvpolicy.document_codes import LAUNCH_REFUSED, MISSING_FIELD, VALUE_NOT_ALLOWED, DocumentCode

from .class_defaults import config_class
from .config_values import ModelSpecError, config_int

VOCAB_PADDING = 64
"""``DEFAULT_VOCAB_PADDING_SIZE``: vLLM pads the vocabulary to a multiple of it before splitting it."""


class ModelBuildRefused(ModelSpecError):
    """vLLM refuses the launch while it builds the model: ``module`` is the module it is building then (vLLM's
    name: ``model.embed_tokens``, ``model.layers.N.self_attn``, ``model.layers.N.mlp``, and in an MoE layer
    ``...mlp.shared_experts`` or ``...mlp.experts``; ``model`` for an embedding vLLM does not name (Llama,
    Mistral, Gemma-2, gpt-oss); gpt-oss's attention is ``model.layers.N.attn``)."""

    def __init__(self, message: str, module: str, key: tuple[str, ...], code: DocumentCode = LAUNCH_REFUSED) -> None:
        super().__init__(message, key, code)
        self.module = module


def check_heads(config: Mapping[str, Any], tp: int) -> None:
    """The one check vLLM makes when it builds its config: the size divides the attention heads."""
    if tp == 1:
        return
    heads = config_int(config, "num_attention_heads")
    if heads % tp:
        fits = ", ".join(str(d) for d in range(1, 17) if heads % d == 0)
        raise ModelSpecError(
            f"--tensor-parallel-size {tp} does not divide the model's {heads} attention heads, and vLLM refuses "
            f"it at start-up; use a size that divides {heads} (up to 16: {fits})",
            ("num_attention_heads",), LAUNCH_REFUSED,
        )


def check_build(config: Mapping[str, Any], tp: int, split_kv_heads: bool,
                on_attention: Callable[[int], None] | None = None, kv_layer: int = 0) -> None:
    """Refuse what vLLM refuses while it builds the model (ModelBuildRefused), in its order: the embedding, then
    per layer the attention (``split_kv_heads``: standard attention's KV heads; MLA and DeepSeek-V4 keep one
    latent), where ``on_attention(layer)`` runs the attention layer's own checks (vLLM picks the backend as it
    builds the first attention layer), and the MLP. ``kv_layer``: a later attention layer whose checks differ
    from the first's (the first a Quark ``exclude`` leaves quantized), where they run again."""
    _check_vocabulary(config, tp)
    for layer, part in _build_order(config, kv_layer):
        if part == "attention" or part == "kv":
            if split_kv_heads and part == "attention":
                _check_attention(config, tp, layer)
            if on_attention is not None:
                on_attention(layer)
        elif part == "window":
            cls = config_class(config)
            raise ModelBuildRefused(
                f"layer_types makes layer {layer} sliding_attention but the config has no sliding_window, which "
                f"vLLM's {config.get('model_type')} model reads for it, so it fails when it builds the model at "
                "start-up; add sliding_window (or make the layer full_attention)",
                f"model.layers.{layer}.{cls.attention if cls is not None else 'self_attn'}",
                ("sliding_window",), MISSING_FIELD,
            )
        else:
            for module, key, size in _mlp_widths(config, layer, part):
                if size % tp:
                    raise ModelBuildRefused(
                        f"--tensor-parallel-size {tp} does not divide {key} {size:,} (layer {layer}'s "
                        f"{_PART_NAMES[module.rsplit('.', 1)[-1]]}), and vLLM refuses it when it builds the model at "
                        f"start-up; use a size that divides {size:,} ({_divisors(size)})",
                        module, (key.split(" ")[0],),  # of a product of two keys, the width's
                    )


def padded_vocabulary(vocab_size: int) -> int:
    """``pad_vocab_size``: the vocabulary rounded up to a multiple of 64."""
    return -(-vocab_size // VOCAB_PADDING) * VOCAB_PADDING


def _check_vocabulary(config: Mapping[str, Any], tp: int) -> None:
    if config.get("vocab_size") is None:
        return  # a model type whose class default kvpolicy does not know
    vocab = config_int(config, "vocab_size")
    padded = padded_vocabulary(vocab)
    cls = config_class(config)
    if padded % tp:
        raise ModelBuildRefused(
            f"--tensor-parallel-size {tp} does not divide the vocabulary of {vocab:,} tokens as vLLM pads it "
            f"({padded:,}, a multiple of {VOCAB_PADDING}), and vLLM's embedding refuses it when it builds the model "
            f"at start-up; use a size that divides {padded:,} ({_divisors(padded)})",
            cls.embedding if cls is not None else "model.embed_tokens", ("vocab_size",),
        )


def _check_attention(config: Mapping[str, Any], tp: int, layer: int) -> None:
    heads = config_int(config, "num_attention_heads")
    kv_heads = config_int(config, "num_key_value_heads", heads)
    cls = config_class(config)
    module = f"model.layers.{layer}.{cls.attention if cls is not None else 'self_attn'}"
    # The KV heads are the attention heads where the config gives none (vLLM's fallback).
    key = ("num_key_value_heads",) if config.get("num_key_value_heads") is not None else ("num_attention_heads",)
    if not kv_heads:
        return
    if cls is not None and not cls.replicates_kv_heads and kv_heads < tp:
        raise ModelBuildRefused(
            f"--tensor-parallel-size {tp} is more than the model's {kv_heads} KV heads, which vLLM's "
            f"{config.get('model_type')} attention does not replicate across ranks (each would hold none), so it "
            f"fails when it builds the model at start-up; use at most {kv_heads}",
            module, key,
        )
    if kv_heads % tp if kv_heads >= tp else tp % kv_heads:
        raise ModelBuildRefused(
            f"--tensor-parallel-size {tp} neither divides the model's {kv_heads} KV heads nor is a multiple of "
            f"them, and vLLM's attention layers refuse it; use a divisor or a multiple of {kv_heads}",
            module, key,
        )
    rank_heads, rank_kv_heads = heads // tp, max(1, kv_heads // tp)
    if rank_heads % rank_kv_heads:
        per_rank = f" ({rank_heads} and {rank_kv_heads} per rank)" if tp > 1 else ""
        raise ModelBuildRefused(
            f"the model's {heads} attention heads are not a multiple of its {kv_heads} KV heads{per_rank}, and "
            "vLLM's attention layer refuses it when it builds the model at start-up",
            module, key, VALUE_NOT_ALLOWED if heads % kv_heads else LAUNCH_REFUSED,  # the config alone, or with TP
        )


Part = Literal["attention", "window", "kv", "dense", "moe", "experts"]
_PART_NAMES = {"mlp": "MLP", "shared_experts": "shared experts", "experts": "experts"}


def _build_order(config: Mapping[str, Any], kv_layer: int = 0) -> Iterator[tuple[int, Part]]:
    """(layer, part) in the order vLLM builds them, the first layer of each kind only (later layers of a kind
    repeat its checks), and ``kv_layer``'s attention (``kv``: after its window, as vLLM's attention class reads
    the window before it builds its ``Attention``) where it is not the first."""
    cls = config_class(config)
    layers = config_int(config, "num_hidden_layers")
    mlp = cls.mlp if cls is not None else None
    firsts: dict[Part, int] = {}
    if layers:
        firsts["attention"] = 0
    unread = _sliding_without_window(config, layers)
    if unread is not None:
        firsts["window"] = unread
    if mlp == "deepseek":
        firsts |= _deepseek_firsts(config, layers)
    elif mlp is not None and layers:
        firsts["experts" if mlp == "experts" else "dense"] = 0
    if 0 < kv_layer < layers:
        firsts["kv"] = kv_layer
    order: list[Part] = ["attention", "window", "kv", "dense", "moe", "experts"]  # in a layer: attention, then MLP
    yield from sorted(((layer, part) for part, layer in firsts.items()), key=lambda lp: (lp[0], order.index(lp[1])))


def _sliding_without_window(config: Mapping[str, Any], layers: int) -> int | None:
    """The first layer ``layer_types`` makes sliding in a model that reads the window per layer, when the config
    (its class included) has no ``sliding_window`` at all (a Llama config): vLLM's attention reads it there."""
    cls = config_class(config)
    types = config.get("layer_types")
    if cls is None or cls.windows != "per_layer" or "sliding_window" in config or not isinstance(types, list):
        return None
    return next((i for i, t in enumerate(types[:layers]) if t == "sliding_attention"), None)


def _deepseek_firsts(config: Mapping[str, Any], layers: int) -> dict[Part, int]:
    """DeepSeek-V2/V3's first dense and first MoE layer: layer i is MoE when the config has routed experts,
    i >= first_k_dense_replace and i % moe_layer_freq == 0 (``DeepseekV2DecoderLayer``)."""
    dense_until = config_int(config, "first_k_dense_replace", 0)
    freq = config_int(config, "moe_layer_freq", 1) or 1
    routed = config.get("n_routed_experts") is not None
    firsts: dict[Part, int] = {}
    first_moe = -(-dense_until // freq) * freq if routed else layers
    if first_moe < layers:
        firsts["moe"] = first_moe
    # With MoE from layer 0 on, every moe_layer_freq-th layer is MoE and the others dense.
    first_dense = 0 if not routed or dense_until > 0 else 1 if freq > 1 else layers
    if first_dense < layers:
        firsts["dense"] = first_dense
    return firsts


def _mlp_widths(config: Mapping[str, Any], layer: int, part: Part) -> list[tuple[str, str, int]]:
    """(module, config key, width) of each part of the layer's MLP that vLLM splits, in its build order."""
    prefix = f"model.layers.{layer}.mlp"
    if part == "dense":
        return [(prefix, "intermediate_size", config_int(config, "intermediate_size"))]
    if part == "experts":
        return [(f"{prefix}.experts", "intermediate_size", config_int(config, "intermediate_size"))]
    width = config_int(config, "moe_intermediate_size")
    widths = []
    if config.get("n_shared_experts") is not None:
        shared = width * config_int(config, "n_shared_experts")
        widths.append((f"{prefix}.shared_experts", "moe_intermediate_size × n_shared_experts", shared))
    widths.append((f"{prefix}.experts", "moe_intermediate_size", width))
    return widths


def _divisors(size: int) -> str:
    fits = [d for d in range(1, 17) if size % d == 0]
    return f"up to 16: {', '.join(map(str, fits))}"


__all__ = ["ModelBuildRefused", "check_build", "check_heads", "padded_vocabulary"]
