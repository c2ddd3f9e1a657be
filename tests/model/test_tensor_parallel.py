"""Tensor parallelism on the CPU: every built-in part (and plugin parts) split over 2 gloo
processes gives the logits, the loss and the gradients of the whole model, and cached decoding
under the split equals its full forward (``attnlab.testing.tensor_parallel``: the processes
start once for every case)."""

from __future__ import annotations

import pytest

from attnlab.base.errors import UserError
from attnlab.config import load_config
from attnlab.parts import registry
from attnlab.parts.tp import TPPlan
from attnlab.testing import tensor_parallel as tpc
from attnlab.testing.cases import CASES, accepted
from tests.helpers.paths import FIXTURES

PLUGIN = FIXTURES / "tp" / "tp_plugin_parts.py"
BASE = CASES[0]


def _builtin_jobs() -> list[tpc.Job]:
    """Every built-in part in the first case that accepts it, and the baseline in every family,
    with qk-norm and with each logit-bias position."""
    jobs = []
    for slot in registry.SLOTS:
        for kind in registry.kinds(slot):
            spec = registry.get(slot, kind)
            if kind == registry.NONE or spec.source != registry.BUILTIN:
                continue
            ok, _ = accepted(slot, kind, {})
            if ok:
                jobs.append(tpc.job_for(slot, kind, ok[0][0]))
    firsts = {c.family: c for c in reversed(CASES)}
    jobs += [tpc.job_for("query", "linear", c) for f, c in firsts.items() if f != BASE.family]
    jobs.append(tpc.job_for("query", "linear", BASE, sets=("model.attention.qk_norm=true",)))
    jobs.append(tpc.job_for("value", "moe", BASE, {"impl": "loop", "n_experts": 6}))
    jobs.append(tpc.job_for("ffn", "geglu", BASE, sets=("model.bias=true",)))
    jobs.append(tpc.job_for("ffn", "gelu", BASE, {"hidden": 33}))  # odd: the MLP stays whole
    return jobs


def _plugin_jobs() -> list[tpc.Job]:
    return [
        tpc.Job("score", "tp_head_temperature", BASE, plugin=str(PLUGIN)),
        tpc.Job("side_branch", "tp_low_rank_skip", BASE, plugin=str(PLUGIN)),
    ]


JOBS = _builtin_jobs() + _plugin_jobs()


@pytest.fixture(scope="module")
def measured() -> dict[str, dict]:
    results = tpc.run(JOBS)
    return {_id(j): r for j, r in zip(JOBS, results)}


def _id(job: tpc.Job) -> str:
    opts = ",".join(f"{k}={v}" for k, v in job.options.items())
    sets = "+" + ",".join(job.sets) if job.sets else ""
    return f"{job.slot}.{job.kind}{f'[{opts}]' if opts else ''}@{job.case.name}{sets}"


@pytest.mark.distributed
@pytest.mark.parametrize("job", JOBS, ids=_id)
def test_split_over_two_ranks_equals_one_process(measured, job):
    got = measured[_id(job)]
    assert "error" not in got, got.get("traceback")
    assert got["logits"] <= tpc.LIMIT
    assert got["loss"] <= tpc.LIMIT
    assert got["grad"] <= tpc.GRAD_LIMIT
    if job.case.causal and job.case.family != "retrieval":
        assert got["decode"] is not None and got["decode"] <= tpc.LIMIT
    assert tpc.result(job.slot, job, got).status == "passed"


@pytest.mark.distributed
def test_a_split_model_holds_about_half_its_weights_per_rank(measured):
    base = measured[_id(tpc.job_for("query", "linear", BASE))]
    assert base["share"] < 0.6  # embeddings, W_Q/K/V/O and the MLP split; norms whole
    assert any("split query.linear" in line or "query.linear" in line for line in base["report"])


@pytest.mark.distributed
def test_parts_that_cannot_split_say_why_and_still_run(measured):
    got = measured[_id(tpc.job_for("score", "virtual_heads", BASE))]
    assert any("score.virtual_heads: its kernel mixes all H heads" in x for x in got["report"])
    plugin = measured[_id(_plugin_jobs()[1])]
    assert any(
        "side_branch.tp_low_rank_skip: declares no tensor-parallel plan" in x
        for x in plugin["report"]
    )


@pytest.mark.fast
def test_a_tp_size_that_does_not_divide_the_heads_is_refused():
    from attnlab.model.tensor_parallel import check_tp

    cfg = load_config(
        None, ["model.attention.n_heads=6", "model.attention.n_kv_heads=3", "model.d_model=48"]
    ).model
    with pytest.raises(UserError, match=r"--tp 2 does not divide the heads.*n_heads=6"):
        check_tp(cfg, 2)
    check_tp(cfg, 3)


@pytest.mark.fast
def test_a_plan_that_leaves_a_tensor_unplaced_is_replicated_with_the_reason():
    from attnlab.model.tensor_parallel import placed
    from attnlab.testing.cases import build, config_for

    model = build(config_for(BASE, "query", "linear", {}, ("model.attention.qk_norm=false",)))
    query = model.decoder.blocks[0].attention.query
    plan = placed(query, TPPlan(linears={}))
    assert not plan.split and "w_q.weight" in plan.replicated
    assert placed(query, query.tp_plan()).split
    assert TPPlan(linears={"w_q": "diagonal"}).problems()  # an unknown style


@pytest.mark.distributed
def test_the_battery_tp_property_passes_a_good_plan_and_fails_a_wrong_one():
    from attnlab.parts.plugins import load_plugin
    from attnlab.testing import PartRequest, check_parts

    load_plugin(str(PLUGIN))
    good, wrong = check_parts(
        [PartRequest("score", "tp_head_temperature"), PartRequest("query", "tp_wrong_norm")],
        tp=True,
        compile=False,
        export=False,
    )
    assert good.result("tp").status == "passed", good.result("tp").detail
    bad = wrong.result("tp")
    assert bad.status == "failed" and "logits differ from one process" in bad.detail
    assert bad.measured > tpc.LIMIT


def test_the_tp_property_is_skipped_unless_asked_for():
    from attnlab.testing import check_part

    report = check_part("query", "linear", compile=False, export=False)
    assert report.result("tp").status == "skipped"
    assert "--with-tp" in report.result("tp").detail


@pytest.mark.fast
def test_experts_that_the_ranks_do_not_divide_keep_the_moe_whole():
    from attnlab.model.tensor_parallel import placed
    from attnlab.testing.cases import build, config_for

    opts = {"n_experts": 3, "top_k": 2}
    moe = build(config_for(BASE, "value", "moe", opts)).decoder.blocks[0].attention.value
    plan = moe.tp_plan()
    assert plan.split and plan.whole_output and plan.summed == ("router.weight",)
    assert placed(moe, plan, 3).split
    assert "not a multiple of 2" in placed(moe, plan, 2).replicated


@pytest.mark.distributed
def test_an_mlp_whose_hidden_width_the_ranks_do_not_divide_stays_whole(measured):
    got = measured[_id(tpc.job_for("ffn", "gelu", BASE, {"hidden": 33}))]
    assert any("ffn.gelu: w_in splits 33 features, not a multiple of 2" in x for x in got["report"])
