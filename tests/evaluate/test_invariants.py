"""DESIGN §4's invariants, over random policies and facts of up to 8 GPUs and 64 instances."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpolicy.evaluate.decide import evaluate, prepare
from kvpolicy.facts import Facts
from kvpolicy.units import GiB, MiB, round_down

from .helpers import make_policy, run

PRIORITIES = st.sampled_from([0, 1, 10, 50, 100, 500, 1000])
MINS = st.sampled_from(["0 GiB", "1 GiB", "2 GiB", "3 MiB", "1.5 GiB", "8 GiB", "10%"])
MAXES = st.sampled_from(["8 GiB", "20 GiB", "25%", "100%"])  # never below a min: that is a lint error
RULES = (
    'rule "idle" { when model.idle > 60s; shrink to min; grace 0s }',
    'rule "pressure" { when gpu.free < 8 GiB; order idle desc; shrink to target; grace 0s }',
    'rule "cap" { when model.used > 10 GiB and not (model.priority >= 500); shrink to 4 GiB; grace 0s }',
)


@st.composite
def models(draw, count: int) -> list[str]:
    blocks = []
    for k in range(count):
        fields = [f"priority {draw(PRIORITIES)}", f"weight {draw(st.integers(1, 10000))}"]
        if draw(st.booleans()):
            fields.append(f"min {draw(MINS)}")
        if draw(st.booleans()):
            fields.append(f"max {draw(MAXES)}")
        if draw(st.booleans()):
            fields.append(f"reserve {draw(st.sampled_from(['1 GiB', '10 GiB', '30 GiB']))}")
        blocks.append(f'model "m{k}" {{ {"; ".join(fields)} }}')
    return blocks


@st.composite
def scenarios(draw, with_rules: bool = True, unique_models: bool = False):
    n_gpus = draw(st.integers(1, 8))
    n_instances = draw(st.integers(0, 64))
    n_models = n_instances if unique_models else draw(st.integers(1, 8))
    chunk = draw(st.sampled_from(["2 MiB", "4 MiB", "64 MiB"]))
    headroom = draw(st.sampled_from(["0 GiB", "2 GiB", "5%"]))
    text = f"defaults {{ chunk {chunk}; headroom {headroom} }}\n" + "\n".join(draw(models(max(1, n_models))))
    if with_rules:
        text += "\n" + "\n".join(r for r in RULES if draw(st.booleans()))
    gpus = [
        {"id": f"cuda:{k}", "capacity": draw(st.sampled_from([24, 80, 141])) * GiB,
         "other_used": draw(st.integers(0, 40)) * GiB + draw(st.integers(0, 3)) * MiB}
        for k in range(n_gpus)
    ]
    instances = []
    for k in range(n_instances):
        elastic = draw(st.booleans()) or draw(st.booleans())
        inst = {
            "id": f"i{k:02d}",
            "model": f"m{k if unique_models else draw(st.integers(0, n_models - 1))}",
            "gpu": f"cuda:{draw(st.integers(0, n_gpus - 1))}",
            "idle_seconds": float(draw(st.sampled_from([0, 30, 90, 600]))),
            "pools": {},
        }
        if draw(st.integers(0, 3)) == 0:
            inst["pools"] = {"swa": {"owner": "runtime", "bytes": draw(st.integers(0, 20)) * GiB}}
        if elastic:
            used = draw(st.integers(0, 30)) * GiB
            inst["elastic"] = {"used": used, "mapped": used}
        if draw(st.integers(0, 4)) == 0:
            inst["engine_id"] = f"tp{draw(st.integers(0, 2))}"
        instances.append(inst)
    facts = {"schema": 1, "now": 5000.0, "gpus": gpus, "instances": instances}
    return text, facts


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(scenarios())
def test_guarantees_targets_limits_are_ordered_and_fit(scenario):
    text, facts = scenario
    decision, _ = run(make_policy(text), Facts.model_validate(facts))
    for gpu in decision.gpus:
        members = [i for i in decision.instances if i.gpu == gpu.id]
        assert sum(i.guarantee for i in members) <= gpu.elastic_budget
        assert gpu.free <= gpu.elastic_budget
        for inst in members:
            if inst.elastic:
                assert inst.guarantee <= inst.target <= inst.limit <= inst.reasons.max, inst
                assert inst.limit % gpu.chunk == 0 and inst.target % gpu.chunk == 0
            else:
                assert (inst.guarantee, inst.limit, inst.target) == (0, 0, 0)


@FAST
@given(scenarios(with_rules=False), st.integers(1, 60), st.data())
def test_raising_a_reservation_lowers_the_budget_and_raises_no_limit(scenario, extra_gib, data):
    text, facts = scenario
    policy = make_policy(text)
    before, _ = run(policy, Facts.model_validate(facts))
    gpu_index = data.draw(st.integers(0, len(facts["gpus"]) - 1))
    gpu = facts["gpus"][gpu_index]
    extra = extra_gib * GiB
    facts["instances"].append(
        {"id": "zz-reserved", "model": "none", "gpu": gpu["id"], "pools": {"c4": {"owner": "runtime", "bytes": extra}}}
    )
    after, _ = run(policy, Facts.model_validate(facts))
    old, new = before.gpu(gpu["id"]), after.gpu(gpu["id"])
    # A - A' = min(X, A) up to the rounding of each to the chunk
    assert abs((old.elastic_budget - new.elastic_budget) - min(extra, old.elastic_budget)) < old.chunk
    for inst in before.instances:
        assert after.instance(inst.id).limit <= inst.limit


@FAST
@given(scenarios(unique_models=True), st.data())
def test_raising_priority_never_lowers_a_guarantee(scenario, data):
    text, facts = scenario
    if not facts["instances"]:
        return
    k = data.draw(st.integers(0, len(facts["instances"]) - 1))
    instance_id = facts["instances"][k]["id"]
    raised = max(_priority(text, k), data.draw(PRIORITIES))
    before, _ = run(make_policy(text), Facts.model_validate(facts))
    after, _ = run(make_policy(_with_priority(text, k, raised)), Facts.model_validate(facts))
    assert after.instance(instance_id).guarantee >= before.instance(instance_id).guarantee


def _priority(text: str, k: int) -> int:
    line = next(x for x in text.splitlines() if x.startswith(f'model "m{k}" '))
    return int(line.split("priority ", 1)[1].split(";", 1)[0])


def _with_priority(text: str, k: int, priority: int) -> str:
    lines = text.splitlines()
    for n, line in enumerate(lines):
        if line.startswith(f'model "m{k}" '):
            head, rest = line.split("priority ", 1)
            lines[n] = f"{head}priority {priority}" + rest[rest.index(";"):]
    return "\n".join(lines)


@FAST
@given(scenarios(), st.randoms(use_true_random=False))
def test_deterministic_whatever_the_input_order(scenario, rng: random.Random):
    text, facts = scenario
    policy = make_policy(text)
    reference, ref_state = run(policy, Facts.model_validate(facts))
    shuffled = dict(facts, gpus=rng.sample(facts["gpus"], len(facts["gpus"])),
                    instances=rng.sample(facts["instances"], len(facts["instances"])))
    decision, state = run(policy, Facts.model_validate(shuffled))
    assert decision.to_json() == reference.to_json()
    assert state.to_json() == ref_state.to_json()


@FAST
@given(st.lists(scenarios(), min_size=2, max_size=4), st.data())
def test_a_prepared_policy_held_across_evaluations_decides_as_a_fresh_one(scenarios_, data):
    """The controller prepares a policy once and evaluates it on every change of the facts:
    what the preparation keeps between evaluations never changes a decision."""
    text = scenarios_[0][0]
    policy = make_policy(text)
    held = prepare(policy)
    held_state = fresh_state = None
    for _, facts in scenarios_:
        facts = Facts.model_validate(dict(facts, now=facts["now"] + data.draw(st.integers(0, 120))))
        decision, held_state = evaluate(held, facts, held_state)
        reference, fresh_state = evaluate(make_policy(text), facts, fresh_state)
        assert decision.to_json() == reference.to_json()
        assert held_state.to_json() == fresh_state.to_json()


def test_rounding_helper_is_exact():
    assert round_down(5 * MiB, 2 * MiB) == 4 * MiB and round_down(4 * MiB, 2 * MiB) == 4 * MiB
