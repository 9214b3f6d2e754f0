"""An elastic vLLM KV cache: vLLM's one backing buffer on kvpolicy's allocator, mapped on demand.

In the order they act: ``policy`` (what the policy says, which vLLM setups can have
one), ``buffer`` (the worker's buffer as reserved address space, mapped under the rank's
elastic session, ``vllm_adapter.ledger``, plus the pinned null-block chunks:
``kvpolicy.alloc.pinned.PinnedFirst``),
``pool`` (vLLM's scheduler block pool whose free queue holds only mapped blocks; it
imports vllm) and ``lifecycle`` (the steps that tie them to an engine's start and steps).
"""
