"""A runtime-owned vLLM KV cache sized by the policy: ``reserve`` → ledger admission → vLLM's switch.

``reserve`` reads the model's ``reserve``; ``sizing`` admits it in the ledger (the
rank's session, ``vllm_adapter.ledger``) and sets vLLM's ``kv_cache_memory_bytes`` to it.
"""
