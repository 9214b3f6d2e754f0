"""Hand-computed scenarios for the evaluator (docs/semantics.md). Each expected figure is
worked out in the comment beside it, from the policy and facts of the test."""

from __future__ import annotations

import json
import random

import pytest

from kvpolicy.evaluate.decision import State

from .helpers import GiB, MiB, gpu, inst, make_facts, make_policy, run


def limits(decision) -> dict[str, tuple[int, int, int]]:
    return {i.id: (i.guarantee, i.limit, i.target) for i in decision.instances}


# ---- guarantees, limits, targets --------------------------------------------------------


def test_mins_that_fit():
    policy = make_policy("""
        model "a" { priority 10; min 10 GiB }
        model "b" { priority 10; min 20 GiB }
    """)
    decision, _ = run(policy, make_facts([gpu(capacity=80 * GiB)], [inst("a/0"), inst("b/0")]))
    # A = 80. g = min. l_a = 80 - 20, l_b = 80 - 10. Spare 50 split 1:1 -> t = g + 25.
    assert limits(decision) == {
        "a/0": (10 * GiB, 60 * GiB, 35 * GiB),
        "b/0": (20 * GiB, 70 * GiB, 45 * GiB),
    }
    assert not any(i.shortfall for i in decision.instances)
    assert decision.gpu("cuda:0").guaranteed == 30 * GiB


def test_mins_that_do_not_fit_share_in_proportion():
    policy = make_policy("""
        model "a" { min 20 GiB }
        model "b" { min 10 GiB }
    """)
    decision, _ = run(policy, make_facts([gpu(capacity=20 * GiB)], [inst("a/0"), inst("b/0")]))
    # need 30 > A = 20: g_a = 20*20/30 = 13653.33 MiB -> 13652 MiB; g_b = 6826.67 MiB -> 6826 MiB.
    # l_a = 20 GiB - 6826.67 MiB = 13653.33 MiB -> 13652 MiB; no spare, t = g.
    assert limits(decision) == {
        "a/0": (13652 * MiB, 13652 * MiB, 13652 * MiB),
        "b/0": (6826 * MiB, 6826 * MiB, 6826 * MiB),
    }
    assert all(i.shortfall for i in decision.instances)
    assert {i.reasons.guarantee for i in decision.instances} == {"shared"}


def test_mins_across_priority_levels():
    policy = make_policy("""
        model "hi" { priority 100; min 10 GiB }
        model "mid-*" { priority 50; min 20 GiB }
        model "low" { priority 1; min 5 GiB }
    """)
    facts = make_facts([gpu(capacity=40 * GiB)], [inst("hi/0"), inst("mid-1/0"), inst("mid-2/0"), inst("low/0")])
    decision, _ = run(policy, facts)
    # hi fits (10, 30 left); mid needs 40 > 30: 15 each; low gets 0.
    # l_hi = 40 - 30 = 10; l_mid = 40 - 25 = 15; l_low = 40 - 40 = 0.
    assert limits(decision) == {
        "hi/0": (10 * GiB, 10 * GiB, 10 * GiB),
        "mid-1/0": (15 * GiB, 15 * GiB, 15 * GiB),
        "mid-2/0": (15 * GiB, 15 * GiB, 15 * GiB),
        "low/0": (0, 0, 0),
    }
    low = decision.instance("low/0")
    assert low.shortfall and low.reasons.guarantee == "lower_priority"
    assert not decision.instance("hi/0").shortfall


def test_max_as_percent_of_capacity():
    policy = make_policy('model "a" { max 25% }')
    decision, _ = run(policy, make_facts([gpu(capacity=80 * GiB)], [inst("a/0")]))
    # max = 25% of 80 GiB = 20 GiB; the spare is capped there.
    assert limits(decision)["a/0"] == (0, 20 * GiB, 20 * GiB)
    assert decision.instance("a/0").reasons.limit == "max"


def test_weights_one_to_three():
    policy = make_policy("""
        model "a" { weight 100 }
        model "b" { weight 300 }
    """)
    decision, _ = run(policy, make_facts([gpu(capacity=40 * GiB)], [inst("a/0"), inst("b/0")]))
    # spare 40 split 1:3.
    assert limits(decision) == {"a/0": (0, 40 * GiB, 10 * GiB), "b/0": (0, 40 * GiB, 30 * GiB)}


def test_water_filling_caps_at_the_limit_and_redistributes():
    policy = make_policy("""
        model "a" { weight 300; max 5 GiB }
        model "b" { weight 100 }
    """)
    decision, _ = run(policy, make_facts([gpu(capacity=40 * GiB)], [inst("a/0"), inst("b/0")]))
    # a's share 30 > its room 5: a takes 5, b takes the other 35.
    assert limits(decision) == {"a/0": (0, 5 * GiB, 5 * GiB), "b/0": (0, 40 * GiB, 35 * GiB)}


def test_headroom_as_percent_and_other_use():
    policy = make_policy("gpu * { headroom 10% }\nmodel \"a\" {}")
    decision, _ = run(policy, make_facts([gpu(capacity=80 * GiB, other_used=12 * GiB)], [inst("a/0")]))
    # A = 80 - 8 - 12 = 60.
    g = decision.gpu("cuda:0")
    assert (g.headroom, g.elastic_budget) == (8 * GiB, 60 * GiB)
    assert limits(decision)["a/0"] == (0, 60 * GiB, 60 * GiB)


def test_capacity_override_specific_id_beats_wildcard():
    policy = make_policy("""
        gpu * { capacity 100 GiB }
        gpu "cuda:1" { capacity 50 GiB }
        model "a" { max 50% }
    """)
    facts = make_facts([gpu("cuda:0"), gpu("cuda:1")], [inst("a/0", gpu="cuda:0"), inst("a/1", gpu="cuda:1")])
    decision, _ = run(policy, facts)
    assert [g.capacity for g in decision.gpus] == [100 * GiB, 50 * GiB]
    assert decision.instance("a/0").limit == 50 * GiB
    assert decision.instance("a/1").limit == 25 * GiB


def test_gpus_with_different_capacities_resolve_percentages_each():
    policy = make_policy('model "a" { min 10%; max 50% }')
    facts = make_facts(
        [gpu("cuda:0", capacity=80 * GiB), gpu("cuda:1", capacity=40 * GiB)],
        [inst("a/0", gpu="cuda:0"), inst("a/1", gpu="cuda:1")],
    )
    decision, _ = run(policy, facts)
    assert limits(decision)["a/0"] == (8 * GiB, 40 * GiB, 40 * GiB)
    assert limits(decision)["a/1"] == (4 * GiB, 20 * GiB, 20 * GiB)


def test_outputs_round_down_to_the_chunk_but_inputs_are_exact():
    policy = make_policy("""
        defaults { chunk 4 MiB }
        model "a" { min 1025 MiB }
    """)
    decision, _ = run(policy, make_facts([gpu(capacity=10 * GiB + 3 * MiB)], [inst("a/0")]))
    # A = 10243 MiB -> shown 10240 MiB; g = 1025 MiB -> shown 1024 MiB, yet no shortfall:
    # the guarantee is the whole min, only the figure shown is rounded.
    a = decision.instance("a/0")
    assert decision.gpu("cuda:0").elastic_budget == 10240 * MiB
    assert (a.guarantee, a.limit, a.target) == (1024 * MiB, 10240 * MiB, 10240 * MiB)
    assert not a.shortfall


def test_instance_without_model_block_gets_defaults():
    policy = make_policy('model "other" { min 4 GiB }')
    decision, _ = run(policy, make_facts([gpu(capacity=20 * GiB)], [inst("stray/0")]))
    stray = decision.instance("stray/0")
    assert stray.policy_model is None
    assert (stray.guarantee, stray.limit, stray.target) == (0, 20 * GiB, 20 * GiB)
    assert stray.reasons.weight == 100


def test_model_binding_exact_then_longest_glob():
    policy = make_policy("""
        model "qwen*" { priority 10 }
        model "qwen3-*" { priority 20 }
        model "qwen3-8b" { priority 50 }
    """)
    facts = make_facts(
        [gpu()],
        [inst("x/0", "qwen3-8b"), inst("y/0", "qwen3-32b"), inst("z/0", "qwen2"), inst("w/0", "llama")],
    )
    decision, _ = run(policy, facts)
    assert {i.id: i.policy_model for i in decision.instances} == {
        "w/0": None,
        "x/0": "qwen3-8b",
        "y/0": "qwen3-*",
        "z/0": "qwen*",
    }


def test_min_above_max_is_treated_as_max():
    policy = make_policy('model "a" { min 50 GiB; max 25% }')
    decision, _ = run(policy, make_facts([gpu(capacity=80 * GiB)], [inst("a/0")]))
    # max = 20 GiB, so the guarantee is 20 GiB and there is no shortfall.
    a = decision.instance("a/0")
    assert (a.guarantee, a.limit, a.shortfall) == (20 * GiB, 20 * GiB, False)


def test_other_use_beyond_capacity_leaves_no_budget():
    policy = make_policy('model "a" { min 4 GiB }')
    decision, _ = run(policy, make_facts([gpu(capacity=40 * GiB, other_used=50 * GiB)], [inst("a/0")]))
    assert decision.gpu("cuda:0").elastic_budget == 0
    a = decision.instance("a/0")
    assert (a.guarantee, a.limit, a.target, a.shortfall) == (0, 0, 0, True)


def test_empty_facts():
    decision, state = run(make_policy('model "a" {}'), make_facts([], []))
    assert decision.gpus == () and decision.instances == ()
    assert state.rules == {}


# ---- reservations and violations -----------------------------------------------------------


def test_reserve_stands_in_until_the_engine_reports_its_pools():
    policy = make_policy("""
        model "dsv4" { engine sglang; reserve 40 GiB }
        model "e" {}
    """)
    before = make_facts([gpu(capacity=80 * GiB)], [inst("dsv4/0", engine="sglang", used=None), inst("e/0")])
    decision, _ = run(policy, before)
    g = decision.gpu("cuda:0")
    assert (g.reserved.total, g.reserved.by_pool, g.elastic_budget) == (40 * GiB, {"reserve": 40 * GiB}, 40 * GiB)
    after = make_facts(
        [gpu(capacity=80 * GiB)],
        [inst("dsv4/0", engine="sglang", used=None, pools={"swa": 10 * GiB, "c4": 20 * GiB}), inst("e/0")],
    )
    decision, _ = run(policy, after)
    g = decision.gpu("cuda:0")
    assert g.reserved.by_pool == {"c4": 20 * GiB, "swa": 10 * GiB}
    assert (g.reserved.total, g.elastic_budget) == (30 * GiB, 50 * GiB)
    dsv4 = decision.instance("dsv4/0")
    assert (dsv4.elastic, dsv4.guarantee, dsv4.limit, dsv4.target) == (False, 0, 0, 0)
    assert decision.instance("e/0").limit == 50 * GiB


def test_runtime_pool_over_its_max_is_a_violation():
    policy = make_policy("""
        model "dsv4" {
          engine sglang
          pool c4 { owner runtime; max 12 GiB }
          reserve 40 GiB
        }
    """)
    facts = make_facts([gpu()], [inst("dsv4/0", engine="sglang", used=None, pools={"c4": 13 * GiB, "swa": GiB})])
    decision, _ = run(policy, facts)
    (violation,) = decision.instance("dsv4/0").violations
    assert violation.model_dump() == {
        "kind": "pool_over_max", "pool": "c4", "bytes": 13 * GiB, "max": 12 * GiB, "file": "test.kvp", "line": 4,
    }


def test_runtime_pools_above_reserve_exceed_it():
    policy = make_policy('model "dsv4" { engine sglang; reserve 20 GiB }')
    facts = make_facts([gpu()], [inst("dsv4/0", engine="sglang", used=None, pools={"swa": 15 * GiB, "c4": 10 * GiB})])
    decision, _ = run(policy, facts)
    (violation,) = decision.instance("dsv4/0").violations
    assert (violation.kind, violation.pool, violation.bytes, violation.max, violation.line) == (
        "reserve_exceeded", None, 25 * GiB, 20 * GiB, 2,
    )


# ---- tensor parallel -------------------------------------------------------------------------


def test_tensor_parallel_engine_gets_its_smallest_limit_on_every_gpu():
    policy = make_policy('model "pro" { min 8 GiB }')
    gpus = [gpu(f"cuda:{k}", capacity=80 * GiB, other_used=30 * GiB if k == 3 else 0) for k in range(8)]
    facts = make_facts(gpus, [inst(f"pro/{k}", "pro", gpu=f"cuda:{k}", engine_id="pro") for k in range(8)])
    decision, _ = run(policy, facts)
    # Alone on its GPU each rank could take 80 GiB, but cuda:3 has 30 GiB of other use: 50 everywhere.
    assert {i.limit for i in decision.instances} == {50 * GiB}
    assert {i.target for i in decision.instances} == {50 * GiB}
    assert {i.reasons.tensor_parallel_size for i in decision.instances} == {8}
    assert decision.instance("pro/0").reasons.limit == "tensor_parallel"
    assert decision.instance("pro/3").reasons.limit in ("budget", "max")


def test_tensor_parallel_cap_lowers_the_guarantee_but_not_neighbours_limits():
    policy = make_policy("""
        model "tp" { priority 100; min 30 GiB }
        model "solo" { priority 1 }
    """)
    facts = make_facts(
        [gpu("cuda:0", capacity=40 * GiB), gpu("cuda:1", capacity=40 * GiB, other_used=20 * GiB)],
        [inst("tp/0", "tp", gpu="cuda:0", engine_id="tp"), inst("tp/1", "tp", gpu="cuda:1", engine_id="tp"),
         inst("solo/0", gpu="cuda:0")],
    )
    decision, _ = run(policy, facts)
    # cuda:1 has A = 20: tp/1 gets g = l = 20 (shortfall). The group limit is 20, so tp/0's
    # guarantee is capped at 20 too; solo/0's limit still leaves tp/0's 30 alone (40 - 30),
    # so that a change on cuda:1 can never raise a limit on cuda:0.
    assert limits(decision)["tp/1"] == (20 * GiB, 20 * GiB, 20 * GiB)
    assert limits(decision)["tp/0"] == (20 * GiB, 20 * GiB, 20 * GiB)
    assert decision.instance("tp/0").reasons.guarantee == "tensor_parallel"
    assert decision.instance("tp/0").reasons.limit == "tensor_parallel"
    assert decision.instance("solo/0").limit == 10 * GiB


# ---- rules ---------------------------------------------------------------------------------------

IDLE_RULE = """
    model "a" { priority 10; min 4 GiB }
    model "b" { priority 100; min 4 GiB }
    rule "idle" {
      when model.idle > 60s
      shrink to min
      grace 30s
      cooldown 2m
    }
"""


def idle_facts(now: float, idle: float) -> object:
    return make_facts([gpu(capacity=80 * GiB)], [inst("a/0", used=20 * GiB, idle=idle), inst("b/0", used=10 * GiB)], now=now)


def test_idle_rule_before_during_and_after_grace_then_cooldown():
    policy = make_policy(IDLE_RULE)
    free_limit = 80 * GiB - 4 * GiB  # a's limit without the rule: A minus b's guarantee
    d, s = run(policy, idle_facts(1000, idle=100))  # holds from now on: no state yet
    assert d.instance("a/0").actions == () and d.instance("a/0").limit == free_limit
    assert s.memory("idle", "a/0").holding_since == 1000
    d, s = run(policy, idle_facts(1020, idle=120), s)  # 20 s < grace
    assert d.instance("a/0").actions == ()
    d, s = run(policy, idle_facts(1030, idle=130), s)  # 30 s: acts
    a = d.instance("a/0")
    assert (a.limit, [x.rule for x in a.actions], a.actions[0].line) == (4 * GiB, ["idle"], 4)
    assert a.reasons.limit == "rule" and a.target == 4 * GiB
    d, s = run(policy, idle_facts(1035, idle=135), s)  # stays in force while it holds
    assert d.instance("a/0").limit == 4 * GiB
    d, s = run(policy, idle_facts(1040, idle=0), s)  # stops holding: released, cooldown to 1160
    assert d.instance("a/0").limit == free_limit and d.instance("a/0").actions == ()
    assert s.memory("idle", "a/0").cooldown_until == 1160
    d, s = run(policy, idle_facts(1100, idle=100), s)  # holds again, but in cooldown
    assert d.instance("a/0").actions == ()
    d, s = run(policy, idle_facts(1150, idle=150), s)  # still cooling down (held 50 s)
    assert d.instance("a/0").actions == ()
    d, s = run(policy, idle_facts(1170, idle=170), s)  # cooldown over, held since 1100: acts
    assert d.instance("a/0").limit == 4 * GiB
    assert d.instance("b/0").actions == ()  # b was never idle


def test_a_shrink_on_low_use_ends_when_work_waits_for_memory():
    """``model.waiting``: the shrink of an instance whose use is low ends as soon as it reports work
    waiting for memory (a request larger than the shrink leaves), and none starts while work waits."""
    policy = make_policy("""
        model "a" { min 4 GiB; max 40 GiB }
        rule "reclaim" { when model.used < 3 GiB and model.waiting == 0; shrink to min; grace 3s; cooldown 5s }
    """)

    def facts(now: float, waiting: int) -> object:
        return make_facts([gpu(capacity=48 * GiB)], [inst("a/0", used=1 * GiB, waiting=waiting)], now=now)

    d, s = run(policy, facts(100, waiting=0))
    d, s = run(policy, facts(103, waiting=0), s)  # held for the grace: shrunk to its min
    assert d.instance("a/0").limit == 4 * GiB
    d, s = run(policy, facts(104, waiting=0), s)
    assert d.instance("a/0").limit == 4 * GiB  # in force while nothing waits
    d, s = run(policy, facts(105, waiting=5 * GiB), s)  # a 5 GiB prompt cannot start at 4 GiB
    assert d.instance("a/0").limit == 40 * GiB and d.instance("a/0").actions == ()
    assert s.memory("reclaim", "a/0").cooldown_until == 110
    for now in (111, 115, 120):  # past the cooldown, but the prompt still waits: no new shrink
        d, s = run(policy, facts(now, waiting=5 * GiB), s)
        assert d.instance("a/0").limit == 40 * GiB, now


def test_grace_zero_acts_at_once():
    policy = make_policy("""
        model "a" { min 4 GiB }
        rule "now" { when model.idle > 60s; shrink to min; grace 0s }
    """)
    d, _ = run(policy, make_facts([gpu()], [inst("a/0", used=20 * GiB, idle=61)]))
    assert d.instance("a/0").limit == 4 * GiB


def test_gpu_level_condition_shrinks_the_fewest():
    policy = make_policy("""
        model "t" { min 2 GiB }
        rule "reclaim" {
          when gpu.free < 8 GiB and model.idle > 60s
          order idle desc
          shrink to min
          grace 0s
        }
    """)
    facts = make_facts(
        [gpu(capacity=40 * GiB)],
        [inst("t/a", "t", used=12 * GiB, idle=100), inst("t/b", "t", used=12 * GiB, idle=200),
         inst("t/c", "t", used=12 * GiB, idle=300)],
    )
    d, _ = run(policy, facts)
    # free = 40 - 36 = 4 < 8. The idlest (c) goes first: counted at 2 GiB, free = 14: stop.
    assert [i.id for i in d.instances if i.actions] == ["t/c"]
    assert d.instance("t/c").limit == 2 * GiB


@pytest.mark.parametrize(("direction", "shrunk"), [("asc", "low/0"), ("desc", "high/0")])
def test_order_decides_who_is_shrunk(direction, shrunk):
    policy = make_policy(f"""
        model "low" {{ priority 1 }}
        model "high" {{ priority 500 }}
        rule "reclaim" {{
          when gpu.free < 8 GiB
          order priority {direction}
          shrink to 1 GiB
          grace 0s
        }}
    """)
    facts = make_facts([gpu(capacity=40 * GiB)], [inst("low/0", used=18 * GiB), inst("high/0", used=18 * GiB)])
    d, _ = run(policy, facts)
    assert [i.id for i in d.instances if i.actions] == [shrunk]


def test_shrink_to_target_size_and_percent_never_below_guarantee():
    policy = make_policy("""
        model "a" { min 4 GiB; weight 100 }
        model "b" { weight 300 }
        model "c" { min 6 GiB }
        rule "to-target" { when model.name == "a"; shrink to target; grace 0s }
        rule "to-size" { when model.name == "c"; shrink to 1 GiB; grace 0s }
        rule "to-percent" { when model.name == "b"; shrink to 10%; grace 0s }
    """)
    facts = make_facts([gpu(capacity=100 * GiB)], [inst("a/0"), inst("b/0"), inst("c/0")])
    d, _ = run(policy, facts)
    a, b, c = (d.instance(x) for x in ("a/0", "b/0", "c/0"))
    # spare 90 by weight 100:300:100 -> a's target = 4 + 18 = 22 GiB.
    assert a.limit == a.target == 22 * GiB
    assert b.limit == 10 * GiB and b.target == 10 * GiB  # target clamped to the new limit
    assert c.limit == 6 * GiB  # 1 GiB is below its guarantee: the guarantee wins
    assert [x.shrink_to for x in c.actions] == [6 * GiB]


def test_engine_condition_applies_to_that_engine_only():
    policy = make_policy("""
        rule "vllm-only" { when model.engine == vllm; shrink to 2 GiB; grace 0s }
    """)
    facts = make_facts([gpu()], [inst("v/0", engine="vllm"), inst("s/0", engine="any")])
    d, _ = run(policy, facts)
    assert [i.id for i in d.instances if i.actions] == ["v/0"]


def test_later_rules_see_earlier_shrinks():
    policy = make_policy("""
        model "t" {}
        rule "first" { when gpu.free < 8 GiB and model.idle > 60s; order idle desc; shrink to 0 GiB; grace 0s }
        rule "second" { when gpu.free < 8 GiB; shrink to 0 GiB; grace 0s }
    """)
    facts = make_facts([gpu(capacity=40 * GiB)], [inst("t/a", "t", used=20 * GiB, idle=100), inst("t/b", "t", used=16 * GiB)])
    d, _ = run(policy, facts)
    # first: free = 4 < 8, t/a shrinks (to 0): free = 24. second: free 24 is not < 8: nothing.
    assert [(i.id, [a.rule for a in i.actions]) for i in d.instances] == [("t/a", ["first"]), ("t/b", [])]


# ---- determinism and state ------------------------------------------------------------------------


def test_same_input_in_any_order_gives_byte_identical_json():
    policy = make_policy(IDLE_RULE + 'model "c" { weight 250 }\n')
    gpus = [gpu("cuda:1"), gpu("cuda:0", other_used=3 * GiB)]
    instances = [inst("a/0", used=20 * GiB, idle=100), inst("b/0"), inst("c/0", gpu="cuda:1"), inst("c/1", engine_id="c")]
    reference, ref_state = run(policy, make_facts(gpus, instances))
    rng = random.Random(7)
    for _ in range(10):
        rng.shuffle(instances)
        rng.shuffle(gpus)
        decision, state = run(policy, make_facts(gpus, instances))
        assert decision.to_json() == reference.to_json()
        assert state.to_json() == ref_state.to_json()


def test_state_survives_a_json_round_trip():
    policy = make_policy(IDLE_RULE)
    _, state = run(policy, idle_facts(1000, idle=100))
    restored = State.model_validate(json.loads(state.to_json()))
    direct, _ = run(policy, idle_facts(1031, idle=131), state)
    via_json, _ = run(policy, idle_facts(1031, idle=131), restored)
    assert direct.to_json() == via_json.to_json()
    assert direct.instance("a/0").limit == 4 * GiB


def test_state_of_gone_instances_and_rules_is_dropped():
    policy = make_policy(IDLE_RULE)
    _, state = run(policy, idle_facts(1000, idle=100))
    assert "a/0" in state.rules["idle"]
    facts = make_facts([gpu()], [inst("b/0")], now=1010)
    _, state = run(policy, facts, state)
    assert state.rules == {}
