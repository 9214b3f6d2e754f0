"""The vLLM adapter (validated: vLLM 0.33.0): policy-sized KV cache and per-pool facts.

Modules, in the order data flows:

- ``specs`` / ``model_specs`` / ``planning`` / ``plan``: pure mirrors of vLLM's KV
  planning (config.json → layer specs → groups → blocks); ``kvpolicy plan --engine vllm``.
- ``pools``: the pool vocabulary and per-pool facts from a real ``KVCacheConfig``
  and the scheduler's block pool.
- ``ledger``: what the adapter needs from the ledger (static admission, pool reports).
- ``policy``: reading this model's ``reserve``.
- ``plugin``: the ``vllm.general_plugins`` entry point and the hooks (imports vllm lazily).

Named ``vllm_adapter``, not ``vllm``, so that nothing here can shadow the real package.
Importing this package imports neither torch nor vllm.
"""
