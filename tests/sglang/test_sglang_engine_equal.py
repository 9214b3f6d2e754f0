"""``kvpolicy plan`` equals the real SGLang 0.5.23 over random DeepSeek-V4 configs, budgets and flags.

For each example the real ``KVCacheConfigurator`` sizes the pools from the budget
(``config_from_budget`` → ``resolve_max_num_reqs`` → ``finalize_with_max_running_requests``)
and the real ``ReqToTokenPool`` and ``DeepSeekV4TokenToKVPool`` are built on the
``meta`` device (shapes and bytes without memory, so budgets need no cap); the
closed forms must give the same token counts, the same tensors in the same order,
and refuse exactly when SGLang raises, for the same reason.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvpolicy.adapters.sglang_dsv4 import hooks
from kvpolicy.adapters.sglang_dsv4 import plan as closed
from kvpolicy.adapters.sglang_dsv4.geometry import ModelGeometry
from tests.sglang.sglang_support import (
    RANDOM_EXAMPLES,
    kv_cache_configurator,
    published_server_args,
    real_sizes,
    real_tensors,
    single_process_parallel,
)

pytestmark = pytest.mark.sglang

EXAMPLES = RANDOM_EXAMPLES
RATIO_CHOICES = {  # the ratios a pattern draws from: V4's mix, and patterns without 4 or 128 layers
    "all ratios": (0, 4, 128),
    "no ratio-4 layers": (0, 128),
    "no ratio-128 layers": (0, 4),
    "compressed only": (4, 128),
    "sliding only": (0,),
}


@dataclass(frozen=True)
class Case:
    geometry: ModelGeometry
    budget: int
    flags: dict
    attn_dp_size: int
    pattern: str = "all ratios"
    """Which of RATIO_CHOICES the layers' ratios were drawn from."""

    @property
    def settings(self) -> closed.PlanSettings:
        """What ``kvpolicy plan`` computes with for these flags (a launch's resolution is tested elsewhere)."""
        f = self.flags
        explicit = f["_swa_full_tokens_ratio_explicitly_set"]
        return closed.PlanSettings(
            max_running_requests=f["max_running_requests"],
            swa_ratio=f["swa_full_tokens_ratio"] if explicit else None,
            context_length=self.geometry.max_position_embeddings,
            chunked_prefill_size=f["chunked_prefill_size"],
            max_total_tokens=f["max_total_tokens"],
            attn_dp_size=self.attn_dp_size,
            disable_radix_cache=f["disable_radix_cache"],
            disable_overlap_schedule=f["disable_overlap_schedule"],
            swa_prefix_tails=f["swa_prefix_tails"],
        )


@st.composite
def spread(draw, low_bits: int, high_bits: int) -> int:
    """An integer log-uniform in [2**low_bits, 2**high_bits): every scale equally often, no round numbers."""
    bits = draw(st.integers(low_bits, high_bits - 1))
    return draw(st.integers(1 << bits, (2 << bits) - 1))


@st.composite
def cases(draw) -> Case:
    kind = draw(st.sampled_from(sorted(RATIO_CHOICES)))
    layers = draw(st.integers(2, 64))
    ratios = draw(st.lists(st.sampled_from(RATIO_CHOICES[kind]), min_size=layers, max_size=layers))
    mtp = draw(st.lists(st.sampled_from((0, 4, 128)), max_size=1))  # a next-n layer past the target's
    geometry = ModelGeometry(
        num_hidden_layers=layers,
        compress_ratios=(*ratios, *mtp),
        max_position_embeddings=draw(st.one_of(spread(7, 20), st.just(1 << 20))),
        sliding_window=draw(st.sampled_from((128, 128, 64, 256, 512))),
    )
    ratio = draw(st.one_of(st.none(), st.floats(0.05, 1.0), st.floats(0.001, 0.05)))
    flags = dict(
        max_running_requests=draw(st.one_of(st.none(), spread(0, 12), spread(0, 9), st.just(4096))),
        swa_full_tokens_ratio=ratio if ratio is not None else 0.1,
        _swa_full_tokens_ratio_explicitly_set=ratio is not None,
        chunked_prefill_size=draw(st.one_of(st.sampled_from((-1, 0)), st.integers(1, 16384))),
        max_total_tokens=draw(st.one_of(st.none(), st.none(), spread(0, 24))),
        disable_radix_cache=draw(st.booleans()),
        disable_overlap_schedule=draw(st.booleans()),
        swa_prefix_tails=draw(st.one_of(st.none(), st.integers(0, 64))),
    )
    # 64 KiB to 1 TiB, multiples of nothing; mostly the GiB range engines are given.
    budget = draw(st.one_of(spread(16, 40), spread(28, 38), spread(30, 37)))
    return Case(geometry, budget, flags, attn_dp_size=draw(st.sampled_from((1, 1, 2, 8))), pattern=kind)


# What SGLang raises, by the check that raises it (the closed forms' PlanError.kind) and the
# token count it quotes.
ENGINE_REFUSALS = {
    "swa_too_small": re.compile(r"SWA pool \((\d+) tokens\) cannot hold even one request"),
    "swa_cap_no_room": re.compile(r"SWA pool cap \((\d+) tokens"),
    "not_enough_memory": re.compile(r"Not enough memory"),
}


def engine_refusal(exc: BaseException) -> tuple[str, str | None]:
    if isinstance(exc, ZeroDivisionError):
        return "no_per_token_pool", None
    for kind, pattern in ENGINE_REFUSALS.items():
        match = pattern.search(str(exc))
        if match:
            return kind, (match.group(1) if match.groups() else None)
    raise AssertionError(f"SGLang refused in a way the closed forms do not know: {exc!r}") from exc


def real_engine(case: Case):
    """(SGLang's sizes, its tensors in allocation order, what the adapter reads), or SGLang's refusal."""
    with published_server_args(**case.flags) as args:
        kvc = kv_cache_configurator(case.geometry, args)
        kvc.device, kvc.attn_dp_size = "meta", case.attn_dp_size
        try:
            config = real_sizes(kvc, case.budget)
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:
            return exc
        return config, real_tensors(kvc, config), hooks.live_settings(kvc)


def assert_built_alike(case: Case, sizes: closed.Sizes, config, tensors: list[tuple[str, int]]) -> None:
    """The closed forms' sizes are SGLang's config, and their tensors SGLang's, one by one in allocation order."""
    assert (sizes.tokens.full, sizes.tokens.swa, sizes.tokens.c4, sizes.tokens.c128) == (
        config.max_total_num_tokens, config.swa_max_total_num_tokens,
        config.c4_max_total_num_tokens, config.c128_max_total_num_tokens,
    )
    assert (sizes.c4_state_pool_size, sizes.c128_state_pool_size, sizes.max_running_requests) == (
        config.c4_state_pool_size, config.c128_state_pool_size, config.max_running_requests,
    )
    planned = closed.pool_tensors(case.geometry, case.settings, sizes)
    assert [(t.pool, t.nbytes) for t in planned] == tensors


def test_plan_equals_the_engine_over_random_configs(sglang_env):
    seen: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, derandomize=False, print_blob=True, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=cases())
    def check(case: Case) -> None:
        for ratio, label in ((4, "no ratio-4 layers"), (128, "no ratio-128 layers")):
            if not case.geometry.layers(ratio):
                event(label)
                seen[label] += 1
        event(f"pattern: {case.pattern}")
        seen[f"pattern: {case.pattern}"] += 1
        real = real_engine(case)
        try:
            ours = closed.plan_for_budget(case.geometry, case.settings, case.budget)
            sizes = closed.size_from_budget(case.geometry, case.settings, case.budget)
        except closed.PlanError as exc:
            assert isinstance(real, BaseException), f"plan refuses ({exc}) what SGLang builds"
            kind, quoted = engine_refusal(real)
            assert exc.kind == kind, (str(exc), str(real))
            assert quoted is None or f"({quoted} tokens" in str(exc), (str(exc), str(real))
            event(f"refused: {kind}")
            seen["refused"] += 1
            seen[kind] += 1
            return
        assert not isinstance(real, BaseException), f"SGLang refuses ({real!r}), plan builds {ours.tokens}"
        config, tensors, live = real
        seen["built"] += 1
        event(f"built: {ours.mode} mode")
        assert live == case.settings  # what the adapter reads from SGLang is what plan computes with
        assert_built_alike(case, sizes, config, tensors)
        per_pool = Counter()
        for name, nbytes in tensors:
            per_pool[name] += nbytes
        assert {k: p.bytes for k, p in ours.pools.items()} == {k: per_pool[k] for k in closed.POOL_NAMES}
        # What plan says of the budget is SGLang's: the table outside it, the pools' own rounding.
        v4 = sum(per_pool[k] for k in closed.V4_POOL_NAMES)
        assert ours.beyond_budget == closed.BeyondBudget(
            total=v4 + per_pool[closed.REQ_TO_TOKEN] - case.budget, req_to_token=per_pool[closed.REQ_TO_TOKEN],
            pools=v4 - case.budget)

    with single_process_parallel():
        check()
    # The strategy must really reach the cases the issue names, not only in principle.
    assert seen["refused"] and seen["built"], seen
    assert seen["no ratio-4 layers"] and seen["no ratio-128 layers"], seen
    assert seen["pattern: sliding only"], seen  # no compressed layer at all: neither 4 nor 128


def test_flash_40_gib_total_is_over_the_budget_as_sglang_builds_it(sglang_env, capsys):
    """``plan --budget "40 GiB"`` prints a total above 40 GiB: SGLang's configurator, given 40 GiB, builds V4
    pools a little over it (its per-token average leaves out each layer's padding page and the rounded-up
    state rows) and allocates the request-to-token table outside it. The plan says so, with SGLang's figures."""
    import json

    from kvpolicy.adapters.sglang_dsv4.geometry import load_geometry
    from kvpolicy.cli import main
    from tests.sglang.sglang_support import MODELS

    budget = 40 << 30
    flash = MODELS / "deepseek-v4-flash.json"
    assert main(["plan", "--engine", "sglang", "--model-config", str(flash), "--budget", "40 GiB",
                 "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    flags = dict(max_running_requests=256, swa_full_tokens_ratio=0.1, _swa_full_tokens_ratio_explicitly_set=True,
                 chunked_prefill_size=8192)  # what a default V4-Flash launch resolves (tested in test_sglang_launch)
    assert plan["settings"]["max_running_requests"] == 256 and plan["settings"]["swa_ratio"] == 0.1
    with single_process_parallel(), published_server_args(**flags) as args:
        kvc = kv_cache_configurator(load_geometry(flash), args)
        kvc.device = "meta"
        tensors = real_tensors(kvc, real_sizes(kvc, budget))
    table = sum(n for name, n in tensors if name == closed.REQ_TO_TOKEN)
    v4 = sum(n for name, n in tensors if name != closed.REQ_TO_TOKEN)
    assert plan["total_bytes"] == table + v4 > budget
    assert v4 > budget  # SGLang's own pools exceed the budget it was given, not only the table
    assert plan["beyond_budget"] == {"total": table + v4 - budget, "req_to_token": table, "pools": v4 - budget}
    main(["plan", "--engine", "sglang", "--model-config", str(flash), "--budget", "40 GiB"])
    text = capsys.readouterr().out
    assert "total vs budget: +1.01 GiB = req_to_token 1.00 GiB (outside the budget) + 10.89 MiB of V4 pools over" in text


def real_engine_for_tokens(case: Case, full_tokens: int):
    """What SGLang builds for ``--max-total-tokens full_tokens`` on a GPU with room to spare (its
    profiled budget is ample, so the cap decides), or its refusal."""
    flags = {**case.flags, "max_total_tokens": full_tokens}
    with published_server_args(**flags) as args:
        kvc = kv_cache_configurator(case.geometry, args)
        kvc.device, kvc.attn_dp_size = "meta", case.attn_dp_size
        try:
            config = real_sizes(kvc, 1 << 50)
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:
            return exc
        return config, real_tensors(kvc, config)


def test_plan_for_full_tokens_equals_the_engine_with_that_token_cap(sglang_env):
    """``plan --full-tokens N`` is what SGLang builds for ``--max-total-tokens N``: token counts, state pools,
    running requests and every tensor; and it refuses where SGLang does (a pool it cannot size at all)."""
    seen: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES // 2, derandomize=False, print_blob=True, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=cases(), full_tokens=spread(0, 24))
    def check(case: Case, full_tokens: int) -> None:
        case = Case(case.geometry, case.budget, {**case.flags, "max_total_tokens": None}, case.attn_dp_size, case.pattern)
        real = real_engine_for_tokens(case, full_tokens)
        try:
            sizes = closed.size_from_full_tokens(case.geometry, case.settings, full_tokens)
        except closed.PlanError as exc:
            assert isinstance(real, BaseException), f"plan refuses ({exc}) what SGLang builds"
            kind, _ = engine_refusal(real)
            assert exc.kind == kind, (str(exc), str(real))
            event(f"refused: {kind}")
            seen["refused"] += 1
            seen[kind] += 1
            return
        assert not isinstance(real, BaseException), f"SGLang refuses ({real!r}), plan builds {sizes.tokens}"
        config, tensors = real
        seen["built"] += 1
        assert_built_alike(case, sizes, config, tensors)

    with single_process_parallel():
        check()
    assert seen["built"] and seen["refused"], seen


def test_a_token_cap_does_not_spare_sglangs_division(sglang_env):
    """Sliding-only layers with SWA sized by the request cap: SGLang profiles a budget before it applies
    ``--max-total-tokens`` and divides by zero bytes per full token there, so no cap makes it start."""
    geometry = ModelGeometry(num_hidden_layers=4, compress_ratios=(0, 0, 0, 0), max_position_embeddings=65536)
    flags = dict(max_running_requests=64, swa_full_tokens_ratio=0.1, _swa_full_tokens_ratio_explicitly_set=False,
                 chunked_prefill_size=8192, max_total_tokens=None, disable_radix_cache=False,
                 disable_overlap_schedule=False, swa_prefix_tails=None)
    case = Case(geometry, budget=0, flags=flags, attn_dp_size=1, pattern="sliding only")
    with single_process_parallel():
        real = real_engine_for_tokens(case, 1 << 20)
    assert isinstance(real, ZeroDivisionError), real
    with pytest.raises(closed.PlanError, match="divides by zero bytes per full token") as refused:
        closed.size_from_full_tokens(case.geometry, case.settings, 1 << 20)
    assert refused.value.kind == "no_per_token_pool"
