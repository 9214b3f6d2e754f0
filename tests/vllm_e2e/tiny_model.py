"""A tiny random-weight Llama, written to a folder vLLM loads like any Hugging Face model.

2 layers, hidden 256, 4 attention heads over 2 KV heads of dimension 64 (vLLM's CPU
attention backend takes head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224 and 256,
not 16), a byte-level tokenizer of 256 byte tokens and 3 special ones built offline
with ``tokenizers`` (no hub download), and safetensors weights drawn from a fixed
seed, so every run writes the same bytes and greedy decoding gives the same tokens.
Needs torch, safetensors and tokenizers (vLLM's own dependencies): the tests run it
with the e2e venv's python, ``python tiny_model.py FOLDER``.

Weights are scaled like a trained model's (unit-variance activations), so the
logits depend on the context: different prompts continue differently, and a KV cache
that held the wrong bytes would change the output.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

SPECIAL_TOKENS = ("<s>", "</s>", "<unk>")  # ids 0, 1, 2; the 256 byte tokens follow
SEED = 20261201


@dataclass(frozen=True)
class TinyLlama:
    """The model's shape (what config.json says)."""

    num_hidden_layers: int = 2
    hidden_size: int = 256
    intermediate_size: int = 512
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    vocab_size: int = len(SPECIAL_TOKENS) + 256
    max_position_embeddings: int = 2048

    def config(self, dtype: str) -> dict[str, object]:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **asdict(self),
            "hidden_act": "silu",
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "torch_dtype": dtype,
        }

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of every layer for one token: what vLLM's full-attention spec counts."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes


def write_tokenizer(folder: Path) -> None:
    """A byte-level BPE tokenizer with no merges: every byte is a token, so any text round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *alphabet))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    bos = SPECIAL_TOKENS[0]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": SPECIAL_TOKENS[0],
                "eos_token": SPECIAL_TOKENS[1],
                "unk_token": SPECIAL_TOKENS[2],
                "model_max_length": TinyLlama.max_position_embeddings,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
    )


def random_weights(shape: TinyLlama, dtype: str, seed: int = SEED) -> dict[str, object]:
    """Hugging Face Llama parameter names and shapes, normal(0, 1/fan_in) from ``seed``; norms are ones."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    h, kv = shape.hidden_size, shape.num_key_value_heads * shape.head_dim
    q = shape.num_attention_heads * shape.head_dim

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return torch.randn(out_features, in_features, generator=gen) / in_features**0.5

    weights: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(shape.vocab_size, h, generator=gen)}
    for i in range(shape.num_hidden_layers):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": torch.ones(h),
            p + "self_attn.q_proj.weight": linear(q, h),
            p + "self_attn.k_proj.weight": linear(kv, h),
            p + "self_attn.v_proj.weight": linear(kv, h),
            p + "self_attn.o_proj.weight": linear(h, q),
            p + "post_attention_layernorm.weight": torch.ones(h),
            p + "mlp.gate_proj.weight": linear(shape.intermediate_size, h),
            p + "mlp.up_proj.weight": linear(shape.intermediate_size, h),
            p + "mlp.down_proj.weight": linear(h, shape.intermediate_size),
        }
    weights["model.norm.weight"] = torch.ones(h)
    weights["lm_head.weight"] = linear(shape.vocab_size, h)
    target = getattr(torch, dtype)
    return {name: w.to(target).contiguous() for name, w in weights.items()}


def write_tiny_llama(folder: Path, shape: TinyLlama = TinyLlama(), dtype: str = "bfloat16") -> Path:
    """Write config, tokenizer and weights to ``folder`` (created); returns it."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(shape.config(dtype), indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    write_tokenizer(folder)
    save_file(random_weights(shape, dtype), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


if __name__ == "__main__":
    write_tiny_llama(Path(sys.argv[1]))
