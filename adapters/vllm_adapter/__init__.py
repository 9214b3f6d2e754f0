"""The vLLM adapter (validated: vLLM 0.32.0 and 0.33.0, ``versions``): a policy-sized KV cache, elastic or not, and per-pool facts.

Its parts, in the order data flows:

- ``planning/``: pure mirrors of vLLM's KV planning, no torch, no vllm — ``hf_config``
  (a model's config.json → ``layer_specs``), ``kv_cache_planning`` (specs → groups →
  bytes per block → blocks), ``plan`` (what ``kvpolicy plan --engine vllm`` prints).
- ``pools``: the pool vocabulary, and the split of a rank's one KV buffer into pools
  (per-pool facts from a real ``KVCacheConfig`` and the scheduler's block pool).
- ``identity``: who a rank is (``InstanceKey``) and which GPU it uses.
- ``ledger``: a rank's sessions in the ledger (``kvpolicy.runtime.session``): its
  ``EngineIdentity``, the runtime-owned path's admissions and reports, an elastic
  rank's session.
- ``static/``: a runtime-owned KV cache — the model's ``reserve`` (``reserve``), and
  vLLM sized from its admission in the ledger (``sizing``).
- ``elastic/``: a KV cache on kvpolicy's allocator — what the policy says (``policy``),
  which layout it runs in (``layouts``), the worker's buffer with the pinned null block
  (``buffer``), the scheduler's block pool (``pool``), the steps that tie them to vLLM's
  start and steps (``lifecycle``), and with tensor parallelism the engine core's books of
  its ranks (``group``, ``books``), a rank's side (``rank``) and what they say (``wire``).
- ``reports``: the live split, from the engine core to each worker to the ledger.
- ``versions``: the validated vLLM versions, what differs between them, and the installed one.
- ``hooks``: what each patched vLLM method runs; ``plugin``: the entry point that
  installs them. Settings (``KVPOLICY_*``) are read in ``kvpolicy.adapters.settings``.

Named ``vllm_adapter``, not ``vllm``, so that nothing here can shadow the real package.
Importing this package imports neither torch nor vllm (only ``elastic.pool`` imports vllm).
"""
