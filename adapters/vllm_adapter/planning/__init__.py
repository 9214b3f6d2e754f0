"""vLLM 0.33's KV cache planning as pure code (no torch, no vllm): ``kvpolicy plan --engine vllm``.

``hf_config`` turns a model's config.json into per-layer specs (``layer_specs``);
``kv_cache_planning`` groups them and sizes blocks as vLLM does; ``plan`` is the
report. tests/vllm checks each figure against vLLM's own planning code.
"""
