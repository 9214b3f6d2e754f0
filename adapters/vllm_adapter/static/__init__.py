"""A runtime-owned vLLM KV cache sized by the policy: ``reserve`` → ledger admission → vLLM's switch.

``reserve`` reads the model's ``reserve``; ``ledger`` is what admission and reports
need from the ledger; ``sizing`` admits the reserve and sets vLLM's
``kv_cache_memory_bytes`` to it.
"""
