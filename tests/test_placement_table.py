"""Where each model lives, as one table (issue 36): every role under every registered backend has an
answer, the memory plan and `align plan` say what the table says, YAML values stay the ones users write, and
the calls on a model in its own actor are declared once."""

from __future__ import annotations

import json
import pickle

import pytest
from pydantic import ValidationError

from align.backends import BACKENDS
from align.config.placement import ReferenceSpec
from align.config.reward import RewardSpec
from align.config.teacher import TeacherSpec
from align.models import memory
from align.models.memory import FrozenModel, Workload, estimate
from align.models.placement import Held, Placement, Role, held
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.placement import HELD_WORDS, REFERENCE_COPY, TEACHER_WITH_POLICY
from align.planning.plan import build
from align.planning.services import CALLS, SERVICE_CALLS, ReferenceCalls, RewardCalls, call_names

GB = 10**9
KINDS_WITH_FROZEN = ("dpo", "ppo", "grpo", "rloo", "distill", "eval")


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_the_table_answers_every_role_under_every_backend(backend: str) -> None:
    shards = BACKENDS[backend].frozen_sharded
    for role in Role:
        for kind in KINDS_WITH_FROZEN:
            where = held(role, shards, kind)
            assert where in (Held.REPLICATED, Held.SHARDED), (role, backend, kind)
            scored_alone = role is Role.REWARD and kind != "ppo"  # GRPO/RLOO/eval: in TRL's loop, per rank
            assert (where is Held.SHARDED) == (shards and not scored_alone), (role, backend, kind)


def test_only_fsdp_shards_a_frozen_copy_and_the_memory_plan_agrees() -> None:
    """memory.py counts a `with_policy` model by backend name (models may not import backends): its list of
    sharding backends and the backends' own declaration must not drift apart."""
    assert set(memory.BACKENDS) == set(BACKENDS)
    psi = 10**9
    frozen = Workload(frozen_models=(FrozenModel("reference", psi, "bf16"),))
    for name, backend in BACKENDS.items():
        assert (name in memory.SHARDS_FROZEN) == backend.frozen_sharded, name
        bytes_on_rank = estimate(psi, frozen, backend=name, world_size=8).device.frozen
        whole = held(Role.REFERENCE, backend.frozen_sharded, "dpo") is Held.REPLICATED
        assert bytes_on_rank == (2 * psi if whole else 2 * psi // 8), name


def test_align_plan_says_what_the_table_says() -> None:
    hardware = Hardware(accelerator=True, device_memory=80 * GB, bf16=True)
    for backend in ("ddp", "fsdp"):
        plan = build(load("tests/plans/llama3_8b_ppo_full.yaml", [f"defaults.backend={backend}"]), hardware)
        ppo = plan.stages["ppo"]
        shards = BACKENDS[backend].frozen_sharded
        assert ppo.placement.reference == REFERENCE_COPY
        assert HELD_WORDS[held(Role.REFERENCE, shards, "ppo")] in ppo.placement.description["reference"]
        assert ppo.placement.reward_models == held(Role.REWARD, shards, "ppo")
        grpo_file = "tests/plans/llama3_8b_grpo_full.yaml"
        grpo = build(load(grpo_file, [f"defaults.backend={backend}"]), hardware).stages["grpo"]
        assert grpo.placement.reward_models == held(Role.REWARD, shards, "grpo") == Held.REPLICATED
        assert HELD_WORDS[Held.REPLICATED] in grpo.placement.description["rewards"]


def test_one_spelling_of_with_policy() -> None:
    """The teacher's placement was `with-policy` in the plan and `with_policy` in the file: one value now."""
    assert TEACHER_WITH_POLICY == Placement.WITH_POLICY == "with_policy"
    assert TeacherSpec.model_validate("m").placement == TEACHER_WITH_POLICY


def test_the_yaml_values_stay_and_a_bad_one_names_both() -> None:
    reference = ReferenceSpec.model_validate({"placement": "actor"})
    reward = RewardSpec.model_validate({"model": "rm", "placement": "actor"})
    assert reference.as_actor and reward.as_actor and reference.placement is Placement.ACTOR
    assert reference.model_dump(mode="json")["placement"] == "actor"
    assert json.dumps(reference.model_dump()) == json.dumps(reference.model_dump(mode="json"))
    assert not ReferenceSpec().as_actor and ReferenceSpec().placement == "with_policy"
    with pytest.raises(ValidationError, match="Input should be 'with_policy' or 'actor'"):
        ReferenceSpec.model_validate({"placement": "with-policy"})
    assert pickle.loads(pickle.dumps(reward)) == reward


def test_a_frozen_model_takes_the_strings_it_took() -> None:
    assert FrozenModel("reward", 1, placement="cpu").placement is Held.CPU
    assert FrozenModel("reward", 1).placement is Placement.WITH_POLICY
    with pytest.raises(ValueError, match="use one of \\['with_policy', 'replicated', 'sharded', 'cpu'\\]"):
        FrozenModel("reward", 1, placement="actor")


def test_the_service_calls_are_declared_once_and_both_sides_carry_them(monkeypatch) -> None:
    """The stage side implements each role's protocol; the driver's client forwards exactly those names."""
    from align.run.services import ServiceActor, ServiceClient
    from align.stages.services import ReferenceService, RewardModelService

    assert set(CALLS) == {Role.REWARD, Role.REFERENCE}
    assert call_names(Role.REWARD) == {"score"}
    assert call_names(Role.REFERENCE) == {"log_probs", "fused_log_probs"}
    for implementation, protocol in ((RewardModelService, RewardCalls), (ReferenceService, ReferenceCalls)):
        assert protocol in implementation.__mro__  # declared, not only shaped alike
        role = next(role for role, declared in CALLS.items() if declared is protocol)
        assert all(name in vars(implementation) for name in call_names(role)), implementation
    # the driver's side spells none of them: it carries every declared call by name
    assert not SERVICE_CALLS & set(vars(ServiceActor)) and not SERVICE_CALLS & set(vars(ServiceClient))

    sent = []

    class Handle:
        class call:  # noqa: N801 - stands in for a Ray actor method
            @staticmethod
            def remote(method, *args):
                sent.append((method, args))
                return method

    assert pickle.loads(pickle.dumps(ServiceClient("rewards[0]", None))).role == "rewards[0]"
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "get", lambda ref: ref)
    assert ServiceClient("rewards[0]", Handle()).score(["p"], ["c"]) == "score"
    assert sent == [("score", (["p"], ["c"]))]
    client = ServiceClient("rewards[0]", Handle())
    with pytest.raises(AttributeError):
        client.forward  # noqa: B018 - not a declared call
