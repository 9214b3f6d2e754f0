"""An elastic vLLM KV cache: vLLM's one backing buffer on kvpolicy's allocator, mapped on demand.

In the order they act: ``policy`` (what the policy says, which vLLM setups can have
one), ``layouts`` (the KV cache layout it runs in, and where a block's bytes lie),
``buffer`` (the worker's buffer as reserved address space, mapped under the rank's
elastic session, ``vllm_adapter.ledger``, plus the pinned null-block chunks:
``kvpolicy.alloc.pinned.PinnedFirst``),
``pool`` (vLLM's scheduler block pool whose free queue holds only mapped blocks; it
imports vllm) and ``lifecycle`` (the steps that tie them to an engine's start and steps).
With tensor parallelism the scheduler is in the engine core and the buffers in the ranks:
``group`` (the engine core's side, with ``books``: a driver that maps nothing and keeps the
ranks' mapped chunks), ``rank`` (a rank's side) and ``wire`` (what they say to each other).
"""
