"""Auto mode's chooser and cost model by hand: the plans an engineer would pick in the clear
cases, and fits that recover the costs they were given."""

from __future__ import annotations

import logging
import math
import random
from dataclasses import replace

import pytest

from gateway.auto import FLOOR_MEASURED_S
from gateway.cost_model import WORKLOAD_WINDOW, CostModel, LinearFit, StepCosts
from gateway.planner import Plan, PlanRequest, choose_plan, expected_max, layout_step_s
from minedraft.constants import LAYOUTS

K_MAX = 8


def _reach(p: float) -> tuple[float, ...]:
    """Every draft accepted with probability p given the ones before it."""
    return tuple(p ** j for j in range(1, K_MAX + 1))


def _requests(n: int, p: float, max_draft: int = K_MAX) -> list[PlanRequest]:
    return [PlanRequest(f"r{i}", _reach(p), max_draft) for i in range(n)]


def test_cheap_overlappable_drafting_and_high_acceptance_give_psd_with_long_drafts():
    """Verifying a token costs little next to a step's fixed cost, but the cost still grows
    with the batch, and a draft forward fits inside a verify: two half batches overlap
    drafting with verification and long drafts pay. (With a verifier whose step costs the
    same for any batch two batches only pay its fixed cost twice, see the one-batch case;
    with verification as dear per token as on this CPU, short drafts win.)"""
    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    plan = choose_plan(costs, _requests(8, 0.95), K_MAX)
    assert plan.layout == "psd"
    assert set(plan.draft_lengths.values()) == {K_MAX}
    assert sorted(len(batch) for batch in plan.batches) == [4, 4]
    assert plan.tokens_per_s > plan.considered["sd"] > plan.considered["ar"]


def test_zero_acceptance_gives_no_drafts():
    costs = StepCosts(1e-3, 1e-5, 0.0, 10e-3, 1e-4, 2e-4)
    plan = choose_plan(costs, _requests(8, 0.0), K_MAX)
    assert plan.layout == "ar" and set(plan.draft_lengths.values()) == {0}


def test_free_verifier_batching_and_expensive_drafting_give_one_batch():
    """A verifier whose step costs the same for any batch and a drafter as slow as it: two
    batches would pay the verifier's fixed cost twice for drafting that cannot hide."""
    costs = StepCosts(draft_per_forward=15e-3, draft_per_token=1e-4, draft_fixed=0.0,
                      verify_fixed=20e-3, verify_per_token=0.0, gateway_per_step=2e-4)
    plan = choose_plan(costs, _requests(8, 0.9), K_MAX)
    assert plan.layout in ("ar", "sd") and len(plan.batches) == 1


def test_speculation_off_always_gets_zero():
    costs = StepCosts(2e-3, 1e-5, 0.0, 20e-3, 1e-5, 2e-4)
    requests = _requests(6, 0.95) + [PlanRequest("off", _reach(0.95), 0), PlanRequest("two", _reach(0.95), 2)]
    plan = choose_plan(costs, requests, K_MAX)
    assert plan.draft_lengths["off"] == 0 and plan.draft_lengths["two"] <= 2
    assert max(plan.draft_lengths.values()) > 2


def test_requests_that_draft_badly_draft_less_than_those_that_draft_well():
    """Per-request k: the well-predicted half drafts long, the badly predicted half short."""
    costs = StepCosts(2e-3, 5e-4, 0.0, 10e-3, 5e-4, 2e-4)
    requests = _requests(4, 0.95) + [PlanRequest(f"bad{i}", _reach(0.2), K_MAX) for i in range(4)]
    plan = choose_plan(costs, requests, K_MAX)
    good = [plan.draft_lengths[f"r{i}"] for i in range(4)]
    bad = [plan.draft_lengths[f"bad{i}"] for i in range(4)]
    assert min(good) > max(bad)


def test_expected_max_of_two_calls_that_stray():
    """Two level calls cost about 0.56 sigma more than either (E max of two normals); far
    apart, the longer alone; no jitter, the plain max; the order never matters."""
    assert expected_max(10.0, 10.0, 0.0) == 10.0 and expected_max(3.0, 7.0, 0.0) == 7.0
    level = expected_max(10.0, 10.0, 0.2)
    assert level == pytest.approx(10.0 + 0.2 * 10.0 * math.sqrt(2) / math.sqrt(2 * math.pi))
    assert expected_max(10.0, 4.0, 0.2) == pytest.approx(expected_max(4.0, 10.0, 0.2))
    assert 10.0 < expected_max(10.0, 4.0, 0.2) < 10.0 + 0.01
    # Monte Carlo agrees (independent normals, relative spread 0.2).
    rng = random.Random(1)
    draws = [max(rng.gauss(10.0, 2.0), rng.gauss(8.0, 1.6)) for _ in range(40000)]
    assert expected_max(10.0, 8.0, 0.2) == pytest.approx(sum(draws) / len(draws), rel=0.01)


def test_psd_is_priced_with_the_gateway_at_each_half_step_and_the_jitter_of_level_calls():
    """One request per batch, drafts as long as verifies: psd's cycle is two half-steps,
    each the expected longer of a draft and a verify plus the gateway's share of a call; sd
    pays both calls' times and shares. With a share as dear as the compute psd gains nothing;
    jitter makes psd dearer still, never sd."""
    calm = StepCosts(draft_per_forward=2e-3, draft_per_token=0.0, draft_fixed=0.0,
                     verify_fixed=8e-3, verify_per_token=0.0, gateway_per_step=4e-3)
    requests = [PlanRequest(f"r{i}", (1.0, 1.0, 1.0, 1.0), 4) for i in range(2)]
    plan = choose_plan(calm, requests, 4, layouts=("psd",))
    assert plan.step_s == pytest.approx(2 * (8e-3 + 4e-3))
    sd = choose_plan(calm, requests, 4, layouts=("sd",))
    assert sd.step_s == pytest.approx(8e-3 + 8e-3 + 2 * 4e-3) and plan.tokens_per_s == pytest.approx(sd.tokens_per_s)
    jittery = StepCosts(**{**calm.__dict__, "jitter": 0.2})
    assert choose_plan(jittery, requests, 4, layouts=("psd",)).step_s > plan.step_s
    assert choose_plan(jittery, requests, 4, layouts=("sd",)).step_s == pytest.approx(sd.step_s)
    assert choose_plan(jittery, requests, 4).layout == "sd"


def test_with_early_verify_a_step_passes_the_gateway_once():
    """A step's verify goes out with its draft call: sd pays one gateway share, not two; in
    psd a cycle is the longer of one batch's round (its draft, its verify, the gateway) and
    the busier service's two calls."""
    calm = StepCosts(draft_per_forward=2e-3, draft_per_token=0.0, draft_fixed=0.0,
                     verify_fixed=8e-3, verify_per_token=0.0, gateway_per_step=4e-3, early_verify=True)
    requests = [PlanRequest(f"r{i}", (1.0, 1.0, 1.0, 1.0), 4) for i in range(2)]
    sd = choose_plan(calm, requests, 4, layouts=("sd",))
    assert sd.step_s == pytest.approx(8e-3 + 8e-3 + 4e-3)
    psd = choose_plan(calm, requests, 4, layouts=("psd",))
    assert psd.step_s == pytest.approx(8e-3 + 8e-3 + 4e-3)          # the round: 8 + 8 + 4 > 8 + 8
    assert psd.tokens_per_s == pytest.approx(sd.tokens_per_s)       # batching is free here: a tie
    cheap_gateway = StepCosts(**{**calm.__dict__, "gateway_per_step": 0.0})
    assert choose_plan(cheap_gateway, requests, 4, layouts=("psd",)).step_s == pytest.approx(16e-3)
    slow_drafts = StepCosts(**{**calm.__dict__, "draft_per_forward": 4e-3})     # drafts 16 ms, verifies 8
    assert layout_step_s("psd", slow_drafts, (4, 4)) == pytest.approx(32e-3)          # the drafter's two calls
    assert layout_step_s("psd", slow_drafts, (3, 3)) == pytest.approx(24e-3)          # ... or the round: 12 + 8 + 4


def test_the_data_plane_is_on_the_verifiers_path_in_every_drafting_layout():
    """The verifier takes a step's drafts off the data plane before its forward: sd's step
    and each of psd's verifies carry it, plain decoding (no drafts) never; dear enough, it
    prices drafting out."""
    calm = StepCosts(draft_per_forward=2e-3, draft_per_token=0.0, draft_fixed=0.0,
                     verify_fixed=8e-3, verify_per_token=0.0, gateway_per_step=4e-3, early_verify=True)
    plane = StepCosts(**{**calm.__dict__, "data_plane_per_step": 3e-3})
    assert layout_step_s("sd", plane, (4, 4)) == pytest.approx(layout_step_s("sd", calm, (4, 4)) + 3e-3)
    assert layout_step_s("ar", plane, (0, 0)) == pytest.approx(layout_step_s("ar", calm, (0, 0)))
    # psd's round per batch (8 + 3 + 8 + 4) is longer than the verifier's two calls (2 x 11)
    assert layout_step_s("psd", plane, (4, 4)) == pytest.approx(8e-3 + 3e-3 + 8e-3 + 4e-3)
    slow_drafts = StepCosts(**{**plane.__dict__, "draft_per_forward": 0.5e-3, "gateway_per_step": 0.0})
    assert layout_step_s("psd", slow_drafts, (4, 4)) == pytest.approx(2 * (3e-3 + 8e-3))   # the verifier's two
    requests = [PlanRequest(f"r{i}", (0.9, 0.8, 0.7, 0.6), 4) for i in range(4)]
    assert choose_plan(calm, requests, 4).layout != "ar"
    dear = StepCosts(**{**calm.__dict__, "data_plane_per_step": 40e-3})
    assert choose_plan(dear, requests, 4).layout == "ar"


def test_the_cost_model_prices_the_data_plane_at_the_verifiers_reports():
    model = CostModel()
    assert model.costs().data_plane_per_step == 0.0
    for recv_s in (1e-4, 2e-4, 9e-3, 3e-4, 2e-4):
        model.observe_data_plane(recv_s)
    assert model.costs().data_plane_per_step == pytest.approx(2e-4)       # the median: one slow call moves it little


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1e-3])
def test_times_that_are_not_durations_are_not_fitted(bad):
    """Times come from other processes: one NaN in a fit's running sums would make every
    prediction (and every deadline made from one) NaN for good."""
    model = CostModel()
    for _ in range(4):
        model.observe_verify([2, 2], 0.01)
        model.observe_draft([2, 2], 0.004)
    before = model.costs()
    model.observe_verify([2, 2], bad)
    model.observe_verify([0, 0], bad, borrowed=True)
    model.observe_draft([2, 2], bad)
    model.observe_data_plane(bad)
    model.observe_gateway(0.02, bad)
    assert model.costs() is before
    after = model.costs()
    values = [after.verify([2, 2]), after.draft([2, 2]), after.data_plane_per_step, after.gateway_per_step,
              after.plain_verify([0, 0]), model.median_error]
    assert all(math.isfinite(v) and v >= 0 for v in values)
    assert model.verify_calls == 4 and model.draft_calls == 4


def test_cost_model_jitter_follows_its_errors():
    """The jitter the planner prices overlap with is the model's median error read as a
    normal spread, capped."""
    from gateway.cost_model import MAX_JITTER

    model = CostModel()
    assert model.costs().jitter == 0.0
    rng = random.Random(2)
    for _ in range(300):
        ks = [rng.randint(1, 6) for _ in range(rng.randint(1, 8))]
        model.observe_verify(ks, (5e-3 + 5e-4 * sum(k + 1 for k in ks)) * (1 + rng.gauss(0, 0.1)))
    assert model.costs().jitter == pytest.approx(0.1, rel=0.25)
    for _ in range(300):
        model.observe_verify([1], 5e-3 * rng.choice([0.1, 10.0]))
    assert model.costs().jitter == MAX_JITTER


def test_cost_model_recovers_the_costs_it_measured():
    truth = StepCosts(2e-3, 3e-4, 1e-3, 8e-3, 4e-4, 5e-4)
    model = CostModel()
    rng = random.Random(0)
    for _ in range(200):
        ks = [rng.randint(1, 6) for _ in range(rng.randint(1, 16))]
        noise = 1 + rng.uniform(-0.02, 0.02)
        model.observe_draft(ks, truth.draft(ks) * noise)
        model.observe_verify(ks, truth.verify(ks) * noise)
        model.observe_gateway(wall_s=0.02 + truth.gateway_per_step, busy_s=0.02)
    fitted = model.costs()
    for name in ("draft_per_forward", "draft_per_token", "verify_fixed", "verify_per_token", "gateway_per_step"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.1), name


def test_the_cost_models_answer_is_kept_until_an_observation_changes_it():
    """costs() is asked several times a step; it is worked out once, and afresh after every
    kind of observation (a stale answer would predict and plan from old costs)."""
    model = CostModel()
    answer = model.costs()
    assert model.costs() is answer
    for observe, changed in [
            (lambda: model.observe_verify([2, 2], 0.02), lambda c: c.verify_per_token),
            (lambda: model.observe_draft([2, 2], 0.01), lambda c: c.draft_per_forward),
            (lambda: model.observe_gateway(0.05, 0.01), lambda c: c.gateway_per_step),
            (lambda: model.observe_admitted("r", 100, 10), lambda c: c.prompt_per_output),
            (lambda: model.observe_finished("r", 5), lambda c: c.prompt_per_output)]:
        observe()
        fresh = model.costs()
        assert changed(fresh) != changed(answer)
        assert model.costs() is fresh
        answer = fresh
    model.early_verify = not answer.early_verify
    assert model.costs().early_verify != answer.early_verify


def test_prompt_per_output_is_over_the_last_requests_admitted():
    """Kept as running sums (it is asked every step): a request past the window, a finish,
    and a request admitted again under its id are each counted once, as a recount would."""
    model = CostModel()
    admitted = []
    for i in range(WORKLOAD_WINDOW + 10):
        model.observe_admitted(f"r{i}", 10 + i, 100)
        admitted.append([f"r{i}", 10 + i, 100])
    model.observe_finished("r3", 5)                 # past the window: nothing to change
    model.observe_finished(f"r{WORKLOAD_WINDOW}", 7)
    admitted[WORKLOAD_WINDOW][2] = 7
    model.observe_admitted("r20", 1, 50)            # again: counted once, as the newest
    admitted = [a for a in admitted if a[0] != "r20"] + [["r20", 1, 50]]
    last = admitted[-WORKLOAD_WINDOW:]
    expected = sum(p for _, p, _ in last) / sum(o for _, _, o in last)
    assert model.costs().prompt_per_output == pytest.approx(expected)


def test_a_calls_error_is_against_the_prediction_it_was_made_with():
    """The gateway passes the prediction it made when it sent the call (its deadline's);
    the model's error is measured against that, not against a later fit."""
    model = CostModel()
    for _ in range(20):
        model.observe_verify([1], 0.01, predicted=0.015)
        model.observe_draft([1], 0.02, predicted=0.01)
    assert model.median_error == pytest.approx(0.5)     # |0.015 - 0.01| / 0.01 and |0.01 - 0.02| / 0.02


def test_linear_fit_falls_back_on_its_prior_without_data_and_checks_its_input():
    fit = LinearFit(prior=(1.0, 2.0))
    assert fit.predict((1.0, 1.0)) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        fit.observe((1.0,), 2.0)


def test_a_few_calls_fit_the_fixed_cost_not_the_per_token_price():
    """The memory-bound stand-in's verifier on one core: 100 ms a call plus 8 ms a token, seen
    by a start-up profile's eight calls at one request (k = 0, 1, 2, 4, twice each). The fit
    prices a draft of four at what it costs; shrinking the fixed cost towards its prior (5 ms)
    priced a token at 13 ms, a draft of four 8% dear and a plain step 8% cheap."""
    model = CostModel()
    for k in (0, 0, 1, 1, 2, 2, 4, 4):
        model.observe_verify([k], 0.100 + 0.008 * (k + 1))
    costs = model.costs()
    assert costs.verify_per_token == pytest.approx(0.008, rel=0.1)
    assert costs.verify([4]) == pytest.approx(0.140, rel=0.01)
    assert costs.verify([0]) == pytest.approx(0.108, rel=0.01)
    with pytest.raises(ValueError):
        LinearFit(prior=(1.0, 2.0), prior_weight=(1.0,))


def test_a_fit_at_one_load_keeps_every_price_non_negative_and_prices_the_usual_call_at_its_time():
    """psd at C = 2 on the bundled pair: every verify one request, nearly all with a draft of
    four (8 ms), a few of one to three drafts slower (12 ms: they come at odd moments, after
    a switch), and each request's first with its prompt. Least squares puts a token at a
    negative price there; clamped to 0 after the fit, the usual call was priced at 12 ms
    and psd a third slow. Fitted with every price kept >= 0, the usual call is priced at
    what it takes."""
    model = CostModel()
    for i in range(500):
        if i % 20 == 0:
            model.observe_verify([4], 0.028, new_tokens=100)
        elif i % 25 == 1:
            model.observe_verify([1 + i % 3], 0.012)
        else:
            model.observe_verify([4], 0.008)
    costs = model.costs()
    assert min(costs.verify_fixed, costs.verify_per_token, costs.verify_per_request, costs.verify_per_new_token) >= 0
    assert costs.verify([4]) == pytest.approx(0.008, rel=0.03)
    assert costs.verify([4], new_tokens=100) == pytest.approx(0.028, rel=0.03)


def test_the_non_negative_fit_is_the_best_fit_with_no_negative_price():
    """Against every subset of the weights set to 0 and the others solved freely: no
    non-negative answer fits better than the fit's, whichever weights it starts from holding
    at 0."""
    from itertools import combinations

    from gateway.cost_model import _nonnegative_solve, _solve_on

    def objective(a, rhs, w):
        return 0.5 * sum(w[i] * a[i][j] * w[j] for i in range(len(w)) for j in range(len(w))) \
            - sum(x * y for x, y in zip(w, rhs))

    rng = random.Random(3)
    negative_free_fits = 0
    for _ in range(200):
        d = rng.randint(2, 4)
        rows = [[rng.uniform(-1, 1) for _ in range(d)] for _ in range(d + 3)]
        ys = [rng.uniform(-1, 1) for _ in rows]
        a = [[sum(r[i] * r[j] for r in rows) + (1e-3 if i == j else 0.0) for j in range(d)] for i in range(d)]
        rhs = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(d)]
        w = _nonnegative_solve(a, rhs)
        assert min(w) >= 0
        # Started from the weights an earlier fit held at 0, right or wrong: the same optimum.
        held = tuple(rng.sample(range(d), rng.randint(1, d)))
        assert objective(a, rhs, _nonnegative_solve(a, rhs, held)) == pytest.approx(objective(a, rhs, w), abs=1e-12)
        negative_free_fits += min(_solve_on(a, rhs, list(range(d)))) < 0
        best = min(objective(a, rhs, s) for n in range(d + 1) for free in combinations(range(d), n)
                   if min(s := _solve_on(a, rhs, list(free))) >= 0)
        assert objective(a, rhs, w) <= best + 1e-9
    assert negative_free_fits > 50          # (the constrained case was exercised)


def test_acceptance_estimate_starts_from_the_pool_and_follows_the_request():
    from gateway.acceptance_estimate import AcceptanceEstimate
    from minedraft.metrics import AcceptanceStats

    estimate = AcceptanceEstimate(k_max=4, prior_strength=4.0, initial_rate=0.5)
    assert estimate.reach(AcceptanceStats()) == pytest.approx((0.5, 0.25, 0.125, 0.0625))   # nothing seen yet
    good, bad = AcceptanceStats(), AcceptanceStats()
    for _ in range(20):
        estimate.record(good, 4, 4)             # every draft accepted
        estimate.record(bad, 4, 0)              # none
    newcomer = estimate.reach(AcceptanceStats())
    assert newcomer == pytest.approx((0.5, 0.5, 0.5, 0.5))       # the pool: half the steps took all four
    assert estimate.reach(good)[3] > 0.9 > newcomer[3] > 0.1 > estimate.reach(bad)[0]


def test_the_priors_strength_follows_how_much_requests_differ():
    """Every request accepting each draft with 0.7: a request's few steps are chance, and one
    with bad luck (3 of its first 8 drafts accepted) stays priced near the pool. Half the
    requests at 0.9 and half at 0.2 (code and prose): a request's own record decides within
    those 8 steps. Until MIN_REQUESTS requests are measured, the strength is the least one."""
    from gateway.acceptance_estimate import AcceptanceEstimate
    from minedraft.metrics import AcceptanceStats

    def pool_of(rates: list[float], seed: int = 0) -> AcceptanceEstimate:
        rng, estimate = random.Random(seed), AcceptanceEstimate(k_max=2)
        for rate in rates:
            stats = AcceptanceStats()
            for _ in range(15):
                estimate.record(stats, 2, next((j for j in range(2) if rng.random() >= rate), 2))
        return estimate

    unlucky = AcceptanceStats()
    for step in range(8):
        unlucky.record(1, int(step < 3))

    alike = pool_of([0.7] * 100)
    assert alike.strength() >= 32
    assert alike.reach(unlucky)[0] == pytest.approx(alike.pool_reach()[0], abs=0.06)
    assert alike.pool_reach()[0] == pytest.approx(0.7, abs=0.03)

    differ = pool_of([0.9, 0.2] * 50)
    assert differ.strength() == differ.prior_strength
    assert differ.reach(unlucky)[0] < 0.45 < differ.pool_reach()[0]

    few = pool_of([0.7] * (AcceptanceEstimate.MIN_REQUESTS - 1))
    assert few.strength() == few.prior_strength
    assert len(pool_of([0.7] * 300)._requests) == AcceptanceEstimate.REQUESTS_KEPT


def test_a_fresh_request_priced_hopefully_drafts_as_one_a_standard_deviation_above_the_requests():
    """Where requests differ (half at 0.9, half at 0.2), a newcomer priced hopefully drafts at
    the requests' mean first-draft rate plus the between-request standard deviation, at every
    position (the pool's deep conditional rates, set by the bad half's many steps, are not its
    own); the mean weighs each request once, not by its steps (the bad half takes more steps
    to its end). Before enough requests were measured, rates are taken as spread evenly. Where
    requests are alike, and for a request measured enough, the hopeful price is the plain one."""
    from gateway.acceptance_estimate import AcceptanceEstimate
    from minedraft.metrics import AcceptanceStats

    def pool_of(rates: list[float], seed: int = 0, steps=lambda rate: 15) -> AcceptanceEstimate:
        rng, estimate = random.Random(seed), AcceptanceEstimate(k_max=4)
        for rate in rates:
            stats = AcceptanceStats()
            for _ in range(steps(rate)):
                estimate.record(stats, 1, int(rng.random() < rate))
        return estimate

    differ = pool_of([0.9, 0.2] * 50)
    mean, spread = differ.pool_reach()[0], differ.spread()
    assert mean == pytest.approx(0.55, abs=0.03) and spread ** 0.5 == pytest.approx(0.35, abs=0.04)
    hope = differ.hope()
    assert hope == pytest.approx(mean + spread ** 0.5, abs=0.01)        # (every request took 15 steps)
    newcomer = AcceptanceStats()
    assert differ.reach(newcomer, hopeful=True) == pytest.approx(tuple(hope ** j for j in range(1, 5)))
    assert differ.reach(newcomer) == pytest.approx(differ.pool_reach())
    measured = AcceptanceStats()
    for _ in range(AcceptanceEstimate.MIN_REQUEST_STEPS):
        measured.record(1, 0)
    assert not differ.fresh(measured) and differ.fresh(newcomer)
    assert differ.reach(measured, hopeful=True) == differ.reach(measured)

    alike = pool_of([0.7] * 100)
    assert alike.spread() < 0.01
    assert alike.reach(newcomer, hopeful=True)[0] == pytest.approx(alike.reach(newcomer)[0], abs=0.1)

    bad_last_longer = pool_of([0.9, 0.1] * 8, steps=lambda rate: 5 if rate > 0.5 else 20)
    step_weighted = bad_last_longer.pool_reach()[0]
    assert step_weighted < 0.35
    assert bad_last_longer.hope() > step_weighted + bad_last_longer.spread() ** 0.5 + 0.15

    few = pool_of([0.3] * (AcceptanceEstimate.MIN_REQUESTS - 1))
    assert few.spread() == AcceptanceEstimate.HOPE_UNKNOWN_SPREAD
    assert few.reach(newcomer, hopeful=True)[0] == pytest.approx(0.5 + (1 / 12) ** 0.5)


def test_positions_rarely_drafted_are_extrapolated_from_those_measured():
    """Only short drafts so far, each accepted with 0.9 given the one before: the deep
    positions are predicted from that rate, not from a fixed pessimistic guess (which would
    keep drafts short for ever)."""
    from gateway.acceptance_estimate import AcceptanceEstimate
    from minedraft.metrics import AcceptanceStats

    estimate = AcceptanceEstimate(k_max=6)
    stats = AcceptanceStats()
    for i in range(100):                # drafts of 2: position 1 accepted 90%, position 2 81%
        estimate.record(stats, 2, 2 if i % 100 < 81 else (1 if i % 100 < 90 else 0))
    reach = estimate.pool_reach()
    assert reach[:2] == pytest.approx((0.9, 0.81))
    assert reach[2:] == pytest.approx((0.729, 0.6561, 0.59049, 0.531441))


def test_the_pools_reach_follows_every_step():
    """Worked out once per step of the pool (not per request and call), and anew after each."""
    from gateway.acceptance_estimate import AcceptanceEstimate
    from minedraft.metrics import AcceptanceStats

    estimate, stats = AcceptanceEstimate(k_max=4), AcceptanceStats()
    for _ in range(10):
        estimate.record(stats, 4, 4)
    first = estimate.pool_reach()
    assert first == estimate.pool_reach() == (1.0, 1.0, 1.0, 1.0)
    for _ in range(10):
        estimate.record(stats, 4, 0)
    assert estimate.pool_reach() == pytest.approx((0.5, 0.5, 0.5, 0.5))
    assert estimate.reach(AcceptanceStats())[0] == pytest.approx(0.5)


def test_deep_positions_drafted_only_by_the_requests_that_draft_well_are_not_the_pools():
    """Half the requests accept each draft with 0.85, half with 0.6; auto drafts 8 for the
    first and 2 for the second. Positions 3-8 are measured on the good half alone (0.85^j):
    taken as the pool's, a newcomer would start from them. They are extrapolated instead,
    and come out at under half the good half's error from the pool's true reach (the
    mixture). A request keeps its own record past what it drafted: the good ones' deep
    positions stay above the pool's, the poor ones' below."""
    from gateway.acceptance_estimate import AcceptanceEstimate
    from minedraft.metrics import AcceptanceStats

    rng = random.Random(0)
    estimate = AcceptanceEstimate(k_max=8)
    for request in range(200):
        rate, k = (0.85, 8) if request % 2 else (0.6, 2)
        stats = AcceptanceStats()
        for _ in range(10):
            accepted = next((j for j in range(k) if rng.random() >= rate), k)
            estimate.record(stats, k, accepted)
    truth = [0.5 * 0.85 ** j + 0.5 * 0.6 ** j for j in range(1, 9)]
    good_half = [0.85 ** j for j in range(1, 9)]
    reach = estimate.pool_reach()
    assert reach[:2] == pytest.approx(truth[:2], abs=0.02)            # drafted by every step: measured
    for j in range(2, 8):
        assert abs(reach[j] - truth[j]) < 0.5 * (good_half[j] - truth[j])
    short_and_good, short_and_poor = AcceptanceStats(), AcceptanceStats()
    for _ in range(10):
        short_and_good.record(2, 2)
        short_and_poor.record(2, 0)
    good, poor = estimate.reach(short_and_good), estimate.reach(short_and_poor)
    assert all(g > r > p for g, r, p in zip(good[2:], reach[2:], poor[2:]))
    assert list(good) == sorted(good, reverse=True)


def _active(i: int, max_draft: int | None = None, max_tokens: int = 64):
    from gateway.request import ActiveRequest
    from minedraft.sampling_params import SamplingParams
    from minedraft.sequence import Sequence

    return ActiveRequest(Sequence(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=max_tokens), seed=i), None, None,
                         max_draft=max_draft)


def _planner_with(costs: StepCosts):
    """An AutoPlanner whose cost model has seen exactly `costs` (many exact observations)."""
    from gateway.auto import AutoPlanner

    planner = AutoPlanner(K_MAX)
    for b in (1, 4, 8, 16):
        for k in range(K_MAX + 1):
            ks = [k] * b
            planner.model.observe_verify(ks, costs.verify(ks))
            if k:
                planner.model.observe_draft(ks, costs.draft(ks))
        planner.model.observe_verify([0] * b, costs.verify([0] * b), borrowed=True)
    for _ in range(8):
        planner.model.observe_gateway(wall_s=0.01 + costs.gateway_per_step, busy_s=0.01)
    for _ in range(50):
        for r in range(8):
            planner.acceptance.record(planner.acceptance.pool, K_MAX, K_MAX)   # every draft accepted
    return planner


STEPS_PER_SPELL = 8     # steps that come back in each spell the helpers below run (more than
                        # any layout's SETTLE_STEPS, as in a real spell of 0.2 s)


def _batch(layout: str, requests) -> int:
    """The requests a step of `layout` verifies (psd: half of them)."""
    return max(1, len(requests) // (2 if layout == "psd" else 1))


def _run_for(planner, clock, requests, seconds: float, delivered: float, spells: int = 1) -> list[str]:
    """Plan and run `spells` times for `seconds` each, STEPS_PER_SPELL steps a spell, the requests
    receiving `delivered` times the tokens the plan predicted; -> the layouts run. The first
    spell after a switch is not counted: it starts before the new layout's steps came back."""
    ran = []
    for _ in range(spells):
        plan = planner.replan(requests, K_MAX)
        ran.append(plan.layout)
        unslowed = plan.tokens_per_s * planner.priced_slowdown(plan.layout)
        for _ in range(STEPS_PER_SPELL):
            planner.observe_step(plan.layout, round(unslowed * seconds * delivered / STEPS_PER_SPELL), 0,
                                 _batch(plan.layout, requests))
        clock[0] += seconds
    return ran


def _spell_runner(planner, clock, requests, delivered: dict[str, float]):
    """-> run(seconds): plan, then one spell of STEPS_PER_SPELL steps in which each layout delivers
    `delivered[layout]` (default 1) times the tokens it was predicted to; -> the layout run."""
    def run(seconds: float) -> str:
        plan = planner.replan(requests, K_MAX)
        unslowed = plan.tokens_per_s * planner.priced_slowdown(plan.layout)
        for _ in range(STEPS_PER_SPELL):
            planner.observe_step(plan.layout,
                                 round(unslowed * seconds * delivered.get(plan.layout, 1.0) / STEPS_PER_SPELL), 0,
                                 _batch(plan.layout, requests))
        clock[0] += seconds
        return plan.layout
    return run


def _measured_spell(planner, requests, layout: str, ended: float, predicted_s: float, seconds: float):
    """A spell of `layout` that ended at `ended`, took `seconds` and delivered what the
    planner's model says takes `predicted_s` in that layout."""
    from gateway.auto import _Measured

    wanted = [PlanRequest(r.request_id, planner.acceptance.reach(r.seq.stats), K_MAX) for r in requests]
    plan = choose_plan(planner.costs(), wanted, K_MAX, layouts=(layout,))
    steps = predicted_s / plan.step_s               # (psd's a cycle: each request once)
    return _Measured(ended, tuple(plan.draft_lengths.values()), plan.decode_tokens_per_s * plan.step_s,
                     round(plan.decode_tokens_per_s * predicted_s), 0, seconds, round(steps * len(requests)),
                     round(plan.decode_tokens_per_s * predicted_s))


@pytest.fixture
def one_plan_leads(monkeypatch):
    """For tests of other rules, decided plan by plan: one plan's lead is enough to leave the
    settled layout (LEAD_PLANS)."""
    from gateway import auto

    monkeypatch.setattr(auto, "LEAD_PLANS", 1)


@pytest.fixture
def no_first_trial_of_sd(monkeypatch):
    """The usual costs of these tests put sd at 0.74 of psd, within FIRST_EXPLORE_WITHIN: its
    first trial is no part of what they test, and is kept out."""
    from gateway import auto

    monkeypatch.setattr(auto, "FIRST_EXPLORE_WITHIN", 0.75)


@pytest.fixture
def budget_of_5_percent(monkeypatch):
    """For tests of when re-checks come, not of how much time they may take: a budget that
    allows one within their few simulated seconds."""
    from gateway import auto

    monkeypatch.setattr(auto, "EXPLORE_SHARE", 0.05)


@pytest.fixture(autouse=True)
def floor_measured_at_once(monkeypatch):
    """Plain decoding, settled, is held until FLOOR_MEASURED_S of it is measured: the tests
    below of everything else start from a fresh planner and decide at once; the hold has
    tests of its own (they set it back)."""
    from gateway import auto

    monkeypatch.setattr(auto, "FLOOR_MEASURED_S", 0.0)


@pytest.fixture
def clock(monkeypatch):
    from gateway import auto

    now = [1000.0]
    monkeypatch.setattr(auto.time, "monotonic", lambda: now[0])
    return now


def _long_steps_planner():
    """-> (planner, one request) whose model puts sd 2.8x ahead of plain decoding for one
    request, in steps of about a third of a second (a large target's)."""
    costs = StepCosts(draft_per_forward=0.01, draft_per_token=0.001, draft_fixed=0.0,
                      verify_fixed=0.1, verify_per_token=0.02, gateway_per_step=0.001)
    return _planner_with(costs), [_active(0)]


def test_a_drafting_layouts_slowdown_is_read_from_enough_request_steps_not_seconds_alone():
    """Where a step takes a third of a second, one request's MEASURED_ENOUGH_S holds a step or
    two, whose tokens are mostly chance (1 to k + 1 a step): a drafting layout's slowdown is
    read only once MEASURED_ENOUGH_DRAWS request-steps of it are measured. Plain decoding's
    tokens are its steps', and its slowdown is read from MEASURED_ENOUGH_S as before."""
    from gateway import auto

    planner, one = _long_steps_planner()
    wanted = [PlanRequest("r0", planner.acceptance.reach(one[0].seq.stats), K_MAX)]
    step = {layout: choose_plan(planner.costs(), wanted, K_MAX, layouts=(layout,)).step_s for layout in ("ar", "sd")}
    assert step["ar"] > 0.1 and step["sd"] > 0.3

    def slow_step(layout: str, at: int):
        """One step of `layout` that took twice its prediction."""
        return _measured_spell(planner, one, layout, 1000.0 + at / 10, step[layout], 2 * step[layout])

    for layout in ("sd", "ar"):
        planner._measured[layout].extend(slow_step(layout, at) for at in range(2))
        assert planner._measured_s(layout) >= auto.MEASURED_ENOUGH_S
    assert planner.slowdown("ar") == pytest.approx(2.0, rel=0.02)
    assert planner.slowdown("sd") == 1.0
    planner._measured["sd"].extend(slow_step("sd", at) for at in range(2, auto.MEASURED_ENOUGH_DRAWS))
    assert sum(spell.draws for spell in planner._measured["sd"]) == auto.MEASURED_ENOUGH_DRAWS
    assert planner.slowdown("sd") == pytest.approx(2.0, rel=0.02)


@pytest.mark.parametrize("pace, draws, low, high", [(1.0, 32, 1.0, 1.06), (2.0, 32, 2.0, 2.12),
                                                      (1.0, 2048, 1.3, 1.34)])
def test_acceptance_luck_weighs_on_a_slowdown_only_as_far_as_its_draws_bear_out(pace, draws, low, high):
    """sd's spells gave three quarters of the tokens expected at the draft lengths they ran.
    Over MEASURED_ENOUGH_DRAWS request-steps that is mostly chance (a step gives 1 to k + 1
    tokens), and the acceptance estimate prices acceptance: the slowdown reads the steps'
    pace (on time: about 1; twice their prediction: about 2), the shortfall pulled towards
    nothing by LUCK_PULL_DRAWS. Over thousands of request-steps the shortfall is no luck, and
    it weighs nearly whole (1 / 0.75)."""
    from gateway import auto
    from gateway.auto import _Measured

    planner, one = _long_steps_planner()
    wanted = [PlanRequest("r0", planner.acceptance.reach(one[0].seq.stats), K_MAX)]
    plan = choose_plan(planner.costs(), wanted, K_MAX, layouts=("sd",))
    expected = plan.decode_tokens_per_s * plan.step_s          # tokens a step, at the plan's k
    spells = min(draws, auto.SPELLS_KEPT)
    for at in range(spells):
        steps = draws // spells
        planner._measured["sd"].append(_Measured(1000.0 + at / 1e3, tuple(plan.draft_lengths.values()), expected,
                                                 0.75 * steps * expected, 0, pace * steps * plan.step_s, steps,
                                                 steps * expected))
    assert sum(spell.draws for spell in planner._measured["sd"]) == draws >= auto.MEASURED_ENOUGH_DRAWS
    assert low <= planner.slowdown("sd") <= high
    # The same spells' tokens taken as all that was expected (no estimate at the k they ran),
    # as before: the shortfall is the layout's, whatever the draws.
    planner._measured["sd"] = type(planner._measured["sd"])(
        (spell._replace(expected=spell.tokens) for spell in planner._measured["sd"]),
        maxlen=planner._measured["sd"].maxlen)
    planner._slowdowns_read.clear()
    assert planner.slowdown("sd") == pytest.approx(min(3.0, pace / 0.75), rel=0.02)


def test_a_steps_expected_tokens_are_its_requests_reach_at_the_k_they_ran(clock):
    """What auto expected a step to give: 1 + the reach its k was chosen by, for a request
    verified with the drafts it was planned; any other (its drafter failed: verified with
    none; a plain step) counts the tokens it received."""
    from gateway.batch import DraftedItem
    from gateway.batch_manager import _expected_tokens, _step_expected
    from minedraft.v1 import engine_pb2

    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(4)]
    planner.replan(requests, K_MAX)
    assert planner.plan.layout != "ar"
    ks = [planner.draft_length(req, K_MAX) for req in requests]
    assert all(k > 0 for k in ks)
    assert requests[0].draft_reach == planner.acceptance.reach(requests[0].seq.stats)
    assert _expected_tokens(requests[0], 2) == pytest.approx(1 + sum(requests[0].draft_reach[:2]))
    assert _expected_tokens(_active(9), 2) is None                 # no estimate: a fixed mode's request
    items = [DraftedItem(req, k, 0, _expected_tokens(req, k)) for req, k in zip(requests[:3], ks)]
    items.append(DraftedItem(requests[3], 0))
    results = {
        "r0": engine_pb2.VerifyResult(request_id="r0", token_ids=[5] * (ks[0] + 1), num_draft=ks[0]),
        "r1": engine_pb2.VerifyResult(request_id="r1", token_ids=[5], num_draft=ks[1]),
        "r2": engine_pb2.VerifyResult(request_id="r2", token_ids=[5], num_draft=0),     # drafts dropped
        "r3": engine_pb2.VerifyResult(request_id="r3", token_ids=[5], num_draft=0),
    }
    assert _step_expected(items, results) == pytest.approx(items[0].expected_tokens + items[1].expected_tokens + 2)


@pytest.mark.parametrize("delivered, chosen", [(1.0, "ar"), (2.0, "sd")])
def test_the_best_layout_kept_out_on_the_margin_is_tried_until_measured_then_judged(clock, monkeypatch,
                                                                                    delivered, chosen):
    """sd is predicted ahead of plain decoding, the layout the server settled on, but not by
    the switch margin. Auto tries it to measure it (kept out on the model's word alone, it
    was never run, and never shown to be better or worse than predicted). Its steps are
    long, so the trial outlasts EXPLORE_MAX_S until MEASURED_ENOUGH_DRAWS request-steps are
    measured. Measured delivering what it was predicted to, it stays out on the margin;
    delivering twice that, it is chosen."""
    from gateway import auto

    monkeypatch.setattr(auto, "SWITCH_MARGIN", 4.0)     # sd predicted 2.8x ahead: kept out
    planner, one = _long_steps_planner()
    ran = []
    for _ in range(auto.MEASURED_ENOUGH_DRAWS + 12):
        plan = planner.replan(one, K_MAX)
        ran.append((plan.layout, planner.history[-1].trying, clock[0]))
        tokens = plan.decode_tokens_per_s * plan.step_s * (delivered if plan.layout == "sd" else 1.0)
        planner.observe_step(plan.layout, round(tokens), 0, 1)
        clock[0] += plan.step_s
    trial = [at for layout, trying, at in ran if trying == "sd"]
    assert ran[0][:2] == ("sd", "sd") and all(layout == "sd" for layout, _, _ in ran[:len(trial)])
    assert len(trial) > auto.MEASURED_ENOUGH_DRAWS and trial[-1] - trial[0] > auto.EXPLORE_MAX_S
    assert [layout for layout, _, _ in ran[len(trial):]] == [chosen] * (len(ran) - len(trial))
    assert planner.slowdown("sd") == pytest.approx(1 / delivered, rel=0.1)


def test_a_layout_that_delivers_less_than_predicted_stops_being_chosen(clock, no_first_trial_of_sd):
    """psd predicted best; once its spells deliver half the tokens predicted, auto leaves it.
    The first spell after the switch to it is not counted (the pipeline refills)."""
    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    assert _run_for(planner, clock, requests, 0.2, delivered=0.5, spells=3) == ["psd"] * 3
    assert planner.slowdown("psd") == 1.0                    # 0.2 s counted: not enough yet
    _run_for(planner, clock, requests, 0.2, delivered=0.5)
    assert planner.slowdown("psd") == pytest.approx(2.0, rel=0.03)
    plan = planner.replan(requests, K_MAX)
    assert plan.layout != "psd" and planner.layout_switches == 2


def test_a_spell_whose_steps_verified_another_batch_than_planned_is_not_measured(clock, no_first_trial_of_sd):
    """A spell is measured against its plan's step: one planned for 8 requests whose steps
    verified 2 (a wave's tail) or 16 says nothing about the plan's layout and is left out;
    steps of about the planned batch (psd: half of it) are measured as before."""
    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    requests = [_active(i) for i in range(8)]

    def run(planner, batch: int, spells: int = 4) -> list[str]:
        ran = []
        for _ in range(spells):
            plan = planner.replan(requests, K_MAX)
            ran.append(plan.layout)
            for _ in range(STEPS_PER_SPELL):
                planner.observe_step(plan.layout, round(plan.tokens_per_s * 0.2 * 0.5 / STEPS_PER_SPELL), 0,
                                     batch=batch)
            clock[0] += 0.2
        return ran

    for batch, counted in ((2, False), (16, False), (4, True), (5, True)):
        planner = _planner_with(costs)
        assert run(planner, batch)[:3] == ["psd"] * 3
        assert planner.slowdown("psd") == (pytest.approx(2.0, rel=0.03) if counted else 1.0), batch


def test_a_layouts_slowdown_at_a_load_is_read_from_its_spells_at_about_that_load(clock):
    """psd's spells for 3 requests ran at 0.8 of their prediction, its spells for 4 at 1.25:
    planned for 4 it is priced at 1.25 (at C = 4 a trial over 3 and 4 requests read 0.86 and
    priced psd a third above plain decoding), for 3 at 0.8. Where too little of a load was
    measured (8) the reading is of every load, as it is where no load is asked."""
    from gateway import auto

    costs = StepCosts(2e-4, 5e-5, 0.0, 1e-3, 1e-4, 2e-4)
    planner = _planner_with(costs)
    three, four, eight = ([_active(i) for i in range(n)] for n in (3, 4, 8))
    planner._measured["psd"].extend(_measured_spell(planner, three, "psd", 1000.0 + i / 10, 0.1, 0.08)
                                    for i in range(5))
    planner._measured["psd"].extend(_measured_spell(planner, four, "psd", 1001.0 + i / 10, 0.1, 0.125)
                                    for i in range(5))
    for group in (three, four):
        assert planner._enough("psd", [s for s in planner._measured["psd"] if len(s.draft_lengths) == len(group)])
    assert planner.slowdown("psd", 4) == pytest.approx(1.25, rel=0.02)
    assert planner.slowdown("psd", 3) == pytest.approx(0.8, rel=0.02)
    assert planner.slowdown("psd", 5) == planner.slowdown("psd", 4)     # within NEAR_LOAD of 4
    every_load = planner.slowdown("psd")
    assert 0.9 < every_load < 1.15
    assert planner.slowdown("psd", 8) == every_load
    wanted = [PlanRequest(r.request_id, planner.acceptance.reach(r.seq.stats), K_MAX) for r in four]
    unslowed = choose_plan(planner.costs(), wanted, K_MAX, layouts=("psd",)).tokens_per_s
    clock[0] = 1002.0
    plan = planner.replan(four, K_MAX)
    assert plan.considered["psd"] == pytest.approx(unslowed / 1.25, rel=0.03)
    assert auto.NEAR_LOAD < 4 / 3
    # Plain decoding read 1.3 for 8 requests: psd, measured too little there, is priced so
    # too (as an unmeasured layout is), not at its reading over other loads; at 4, where it
    # was measured, at its own.
    planner._measured["ar"].extend(_measured_spell(planner, eight, "ar", 1002.0 + i / 10, 0.1, 0.13)
                                   for i in range(5))
    assert planner.slowdown("ar", 8) == pytest.approx(1.3, rel=0.02)
    assert planner.priced_slowdown("psd", 8) == pytest.approx(1.3, rel=0.02)
    assert planner.priced_slowdown("psd", 4) == pytest.approx(1.25, rel=0.02)
    assert planner.priced_slowdown("psd", 3) == pytest.approx(0.8, rel=0.02)


def test_the_measured_margin_judges_two_layouts_only_at_a_load_both_were_measured_at(clock):
    """MEASURED_MARGIN is for two layouts each measured CONFIRM_S lately at about the load the
    plan is for: psd measured for 4 requests is judged on it against plain decoding at 4, on
    SWITCH_MARGIN at 8."""
    from gateway import auto

    costs = StepCosts(2e-4, 5e-5, 0.0, 1e-3, 1e-4, 2e-4)
    planner = _planner_with(costs)
    four, eight = [_active(i) for i in range(4)], [_active(i) for i in range(8)]
    spells = round(auto.CONFIRM_S / 0.2) + 1
    planner._measured["psd"].extend(_measured_spell(planner, four, "psd", 1000.0 + i / 5, 0.2, 0.2)
                                    for i in range(spells))
    for group in (four, eight):
        planner._measured["ar"].extend(_measured_spell(planner, group, "ar", 1000.0 + i / 5, 0.2, 0.2)
                                       for i in range(spells))
    clock[0] = 1000.0 + spells / 5
    assert planner._well_measured("psd", clock[0]) and planner._well_measured("ar", clock[0], 8)
    assert planner._switch_margin("psd", clock[0], 4) == auto.MEASURED_MARGIN
    assert planner._switch_margin("psd", clock[0], 5) == auto.MEASURED_MARGIN
    assert planner._switch_margin("psd", clock[0], 8) == auto.SWITCH_MARGIN


def _delivered_spells(planner, requests, layout: str, ended: float, seconds: float, tokens_per_s: float,
                      count: int = 6):
    """`count` spells of `layout` ending `seconds` apart up to `ended`, as the plan for these
    requests made them, each delivering `tokens_per_s` end to end (not as planned: only what
    they delivered is read from them)."""
    from gateway.auto import _Measured

    draft_lengths = tuple(0 if layout == "ar" else K_MAX for _ in requests)
    return [_Measured(ended - (count - 1 - i) * seconds, draft_lengths, 0.0, round(tokens_per_s * seconds), 0,
                      seconds, len(requests), 0.0) for i in range(count)]


@pytest.mark.parametrize("plain_over_psd, plain_measured_s, plain_for, chosen", [
    (1.05, 1.2, 8, "ar"),       # plain decoding delivered more: chosen over psd, priced ahead
    (0.95, 1.2, 8, "psd"),      # ... less: the model decides
    (1.05, 0.6, 8, "psd"),      # measured too little to judge on
    (1.05, 1.2, 4, "psd"),      # measured at another load
])
def test_plain_decoding_that_delivered_more_is_chosen_over_a_drafting_layout_priced_ahead(
        clock, no_trials, plain_over_psd, plain_measured_s, plain_for, chosen):
    """psd settled, priced a fifth ahead of plain decoding by the model and its spells, is
    left for plain decoding where plain decoding delivered at least as much, end to end, at
    about the load (each measured DELIVERED_ENOUGH_S within SLOWDOWN_SPAN_S of its latest),
    whatever the prices; not where it delivered less, was measured too little, or at another
    load."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    rates = choose_plan(costs, planner._wanted(requests, K_MAX), K_MAX).considered
    assert rates["psd"] > 1.2 * rates["ar"]
    planner._settled, planner._settled_for = "psd", len(requests)
    psd_rate = 1000.0
    planner._delivered["psd"].extend(_delivered_spells(planner, requests, "psd", clock[0], 0.2, psd_rate))
    spells = round(plain_measured_s / 0.2)
    planner._delivered["ar"].extend(_delivered_spells(planner, requests[:plain_for], "ar", clock[0] - 2.0, 0.2,
                                                      plain_over_psd * psd_rate, count=spells))
    assert (planner._delivered_rate("ar", 8) is not None) == (plain_measured_s >= auto.DELIVERED_ENOUGH_S
                                                             and plain_for == 8)
    plan = planner.replan(requests, K_MAX)
    assert plan.considered["psd"] > auto.SWITCH_MARGIN * plan.considered["ar"]      # (priced ahead all along)
    assert plan.layout == chosen and planner._settled == chosen


def test_what_plain_decoding_delivered_stands_through_an_idle_minute(clock):
    """Plain decoding delivered 5% more than psd at 8 requests (as in the first case above);
    then the server idles a minute, and the next wave's first request runs plainly alone for
    a moment. The window its delivered rate is read over counts serving time, so the reading
    at 8 still stands and plain decoding is chosen over psd, priced ahead. Counted by the
    clock, the spell after the idle minute left the window empty at 8, and psd was chosen (the
    paired bench at C = 4: auto serves about 4 s in 35)."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    planner._settled, planner._settled_for = "psd", len(requests)
    planner._delivered["psd"].extend(_delivered_spells(planner, requests, "psd", clock[0], 0.2, 1000.0))
    planner._delivered["ar"].extend(_delivered_spells(planner, requests, "ar", clock[0] - 2.0, 0.2, 1050.0))
    planner.idle()
    clock[0] += 60.0
    planner.replan(requests[:1], K_MAX)
    clock[0] += 0.1
    planner._delivered["ar"].extend(_delivered_spells(planner, requests[:1], "ar", clock[0], 0.1, 150.0, count=1))
    assert planner._delivered_rate("ar", 8) == pytest.approx(1050.0, rel=0.01)
    plan = planner.replan(requests, K_MAX)
    assert plan.considered["psd"] > auto.SWITCH_MARGIN * plan.considered["ar"]
    assert plan.layout == "ar"


def _psd_settled_where_plain_decoding_never_delivered(clock, monkeypatch, rates: dict[str, float]):
    """-> (planner, 8 requests): the layouts' rates are `rates` whatever the requests; psd is
    settled at 8 and delivered there, plain decoding delivered at 4 only, and every layout
    was measured lately (no re-check is due)."""
    from gateway import auto

    monkeypatch.setattr(auto, "choose_plan", _chooser_of(lambda n: rates))
    planner = _planner_with(StepCosts(2e-4, 5e-5, 0.0, 1e-3, 1e-4, 2e-4))
    requests = [_active(i) for i in range(8)]
    for layout in LAYOUTS:
        planner._measured[layout].append(_measured_spell(planner, requests, layout, clock[0], 0.3, 0.3))
    planner._delivered["psd"].extend(_delivered_spells(planner, requests, "psd", clock[0], 0.2, rates["psd"]))
    planner._delivered["ar"].extend(_delivered_spells(planner, requests[:4], "ar", clock[0], 0.2, 400.0))
    planner._settled, planner._settled_for, planner.plan = "psd", len(requests), replace(planner.plan, layout="psd")
    return planner, requests


@pytest.mark.parametrize("plain_delivers, chosen", [(1.2, "ar"), (0.9, "psd")])
def test_plain_decoding_is_tried_where_a_drafting_layout_settled_without_it_delivering(
        clock, monkeypatch, plain_delivers, chosen):
    """psd, priced 8% ahead of plain decoding (within the switch margin), is settled at 8
    requests and delivered there; plain decoding delivered at 4 only (its trial at 8 cut
    short by a wave's end), and its measurement there is fresh, so no re-check is due. It
    is tried all the same, free of the trial budget, and past the point its slowdown is
    measured (MEASURED_ENOUGH_S), until it has delivered DELIVERED_ENOUGH_S at 8; then what
    each delivered decides (_plain_delivers_more; the rates here are the model's, whatever
    the slowdowns), and no such trial is made again at that load within FLOOR_STALE_S."""
    from gateway import auto

    rates = {"ar": 500.0, "psd": 540.0, "sd": 300.0}
    planner, requests = _psd_settled_where_plain_decoding_never_delivered(clock, monkeypatch, rates)
    budget = planner._trial_s
    ran, trials, trying, spent = [], [], [], []     # (the layout run, any trial, "ar" where run to
                                                    # measure what it delivers, the trial budget spent)
    step_tokens = {layout: round(rate * (plain_delivers if layout == "ar" else 1.0) * 0.1 / STEPS_PER_SPELL)
                   for layout, rate in rates.items()}
    for _ in range(round(2 * auto.FLOOR_STALE_S / 0.1)):
        plan = planner.replan(requests, K_MAX)
        ran.append(plan.layout)
        trials.append(planner.history[-1].trying)
        delivering = planner._exploring is not None and planner._exploring.delivering
        trying.append(trials[-1] if delivering else "")
        spent.append(planner._trial_s)
        for _ in range(STEPS_PER_SPELL):
            planner.observe_step(plan.layout, step_tokens[plan.layout], 0, _batch(plan.layout, requests))
        clock[0] += 0.1
    stale = round(auto.FLOOR_STALE_S / 0.1)     # (plans in FLOOR_STALE_S)
    tried = [i for i, t in enumerate(trying) if t == "ar"]
    shown = "".join(t[:1] or "-" for t in trying)
    assert tried and tried[0] <= 1, shown                   # (the first plan is a new load's)
    tried = [i for i in tried if i < tried[0] + stale]      # not again within FLOOR_STALE_S: it stands
    assert tried == list(range(tried[0], tried[-1] + 1)), shown
    assert auto.DELIVERED_ENOUGH_S <= 0.1 * len(tried) <= auto.FLOOR_DELIVERY_MAX_S
    assert planner._delivered_rate("ar", 8) == pytest.approx(step_tokens["ar"] * STEPS_PER_SPELL / 0.1)
    assert spent[tried[-1] + 1] == budget                   # (free of the trial budget)
    settled = [layout for layout, trial in zip(ran, trials) if not trial][tried[-1] + 2:]
    assert set(settled) == {chosen}, "".join(layout[0] for layout in ran)      # (re-checks aside)


@pytest.mark.parametrize("earlier_s, tried", [(1.0, True), (2.4, False)])
def test_plain_decoding_measured_briefly_before_a_drafting_layout_settled_is_measured_again(
        clock, monkeypatch, earlier_s, tried):
    """Plain decoding delivered 300 tok/s at 8 requests for a second before psd (540) was
    settled there (a server's first seconds: 579 tok/s in a warm-up at C = 16 against 900-980
    in fixed `ar`). That reading is not what psd is held to: plain decoding is tried again,
    delivers 600, its new reading replaces the old, and it is chosen. A reading of CONFIRM_S
    stands as it is (2.4 s here)."""
    from gateway import auto

    assert 1.0 < auto.CONFIRM_S < 2.4
    rates = {"ar": 500.0, "psd": 540.0, "sd": 300.0}
    planner, requests = _psd_settled_where_plain_decoding_never_delivered(clock, monkeypatch, rates)
    spells = round(earlier_s / 0.2)
    planner._delivered["ar"].extend(_delivered_spells(planner, requests, "ar", clock[0] - 0.5, 0.2, 300.0,
                                                      count=spells))
    planner._settled_at = clock[0]
    assert planner._delivered_rate("ar", 8) == pytest.approx(300.0, rel=0.02)
    step_tokens = {layout: round(rate * (1.2 if layout == "ar" else 1.0) * 0.1 / STEPS_PER_SPELL)
                   for layout, rate in rates.items()}
    ran = []
    for _ in range(round(auto.FLOOR_DELIVERY_MAX_S / 0.1) + 20):
        plan = planner.replan(requests, K_MAX)
        ran.append(plan.layout if not planner.history[-1].trying else "trial")
        for _ in range(STEPS_PER_SPELL):
            planner.observe_step(plan.layout, step_tokens[plan.layout], 0, _batch(plan.layout, requests))
        clock[0] += 0.1
    shown = "".join(layout[0] for layout in ran)
    if tried:
        new = step_tokens["ar"] * STEPS_PER_SPELL / 0.1                                # (about 600)
        assert planner._delivered_rate("ar", 8) == pytest.approx(new)                  # (the old reading gone)
        assert ran[1] == "trial" and set(ran[ran.index("psd", 1) + 1:]) <= {"ar", "trial"}, shown
        assert ran[-1] == "ar" and planner._settled == "ar", shown
    else:
        assert set(ran) <= {"psd", "trial"} and ran[:20] == ["psd"] * 20, shown       # (re-checks aside)


def test_a_trial_of_plain_decoding_that_measured_no_delivery_is_not_made_again_at_once(clock, monkeypatch):
    """Plain decoding's trial to measure what it delivers, ended at FLOOR_DELIVERY_MAX_S with
    nothing measured (none of its steps came back in time), is not begun again at about the
    same load (within NEAR_LOAD) until FLOOR_STALE_S of serving has passed: a load that never
    lets it measure would otherwise run plain decoding, priced behind, for good."""
    from gateway import auto

    planner, requests = _psd_settled_where_plain_decoding_never_delivered(
        clock, monkeypatch, {"ar": 500.0, "psd": 540.0, "sd": 300.0})

    def delivering() -> bool:
        return planner._exploring is not None and planner._exploring.delivering

    planner.replan(requests, K_MAX)                 # (a new load: no trial begins)
    clock[0] += 0.1
    assert planner.replan(requests, K_MAX).layout == "ar" and delivering()
    clock[0] += auto.FLOOR_DELIVERY_MAX_S          # nothing came back
    assert planner.replan(requests, K_MAX).layout == "psd" and not delivering()
    tried_at = clock[0] - auto.FLOOR_DELIVERY_MAX_S
    for running in (requests, requests + [_active(8)]):     # (9: about the same load)
        for _ in range(round((auto.FLOOR_STALE_S - auto.FLOOR_DELIVERY_MAX_S - 1.0) / 2 / 0.5)):
            clock[0] += 0.5
            planner.replan(running, K_MAX)
            assert not delivering(), clock[0] - tried_at
    clock[0] = tried_at + auto.FLOOR_STALE_S + 0.5
    planner.replan(running, K_MAX)
    assert delivering()                             # its wait is over


def test_a_wave_is_delivered_by_its_layout_though_not_measured_against_the_model(clock, no_trials):
    """A spell whose steps did not verify the batch its plan was made for (a wave's prefill,
    a tail) is left out of the layout's slowdown but counts in what it delivered."""
    costs = StepCosts(2e-2, 5e-5, 0.0, 1e-3, 1e-4, 2e-4)       # (plain decoding throughout)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    plan = planner.replan(requests, K_MAX)
    planner.observe_step(plan.layout, 8, 0, batch=8)                # (the first after idling: not counted)
    assert plan.layout == "ar" and planner._spell.counted
    for _ in range(4):
        planner.observe_step(plan.layout, 2, 300, batch=2)          # a wave: 2 a step where 8 were planned
    clock[0] += 0.2
    planner.replan(requests, K_MAX)
    assert not planner._measured[plan.layout]
    assert [(spell.tokens, spell.prompt_tokens) for spell in planner._delivered[plan.layout]] == [(8, 1200)]


def test_idle_time_is_no_layouts(clock):
    """The idle time after a spell is not measured, nor is the first spell after it."""
    costs = StepCosts(2e-4, 5e-5, 0.0, 1e-3, 1e-4, 2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    layout = _run_for(planner, clock, requests, 0.3, delivered=1.0, spells=3)[-1]
    planner.replan(requests, K_MAX)
    planner.idle()
    clock[0] += 60.0                                         # nothing delivered meanwhile
    _run_for(planner, clock, requests, 0.3, delivered=1.0, spells=2)
    assert planner.slowdown(layout) == pytest.approx(1.0, rel=0.01)


def test_a_spell_after_idling_is_counted_from_its_first_steps_return_to_its_last(clock, no_first_trial_of_sd):
    """Requests served one after another, each alone in its spell: a plan begins with each
    (the last one was made less than replan_interval_s before), and its spell is measured from
    the return of its layout's first steps (the prompts' prefill and the pipeline's refill)
    up to the idling after its last step. Counted from the plan, every spell here read 2.8x
    slow; not counted at all, or from the next plan only, a layout serving one request after
    another at C = 1 was measured for a third of its time or never."""
    from gateway import auto

    costs = StepCosts(2e-2, 5e-5, 0.0, 1e-3, 1e-4, 2e-4)      # (drafting far too dear to be tried)
    planner = _planner_with(costs)
    requests = [_active(0)]
    ran = []
    for _ in range(3):                                  # 3 x 0.12 s decoding: enough, just
        assert planner.replan_due(len(requests))
        plan = planner.replan(requests, K_MAX)
        ran.append(plan.layout)
        clock[0] += 0.05                                # the first steps: prefill and refill
        for _ in range(auto.AFTER_IDLE_STEPS[plan.layout]):
            planner.observe_step(plan.layout, 50, 8, _batch(plan.layout, requests))
        for _ in range(STEPS_PER_SPELL):                # then half the tokens the plan predicted
            planner.observe_step(plan.layout, round(plan.tokens_per_s * 0.12 * 0.5 / STEPS_PER_SPELL), 0,
                                 _batch(plan.layout, requests))
        clock[0] += 0.12
        planner.idle()
        clock[0] += 0.01                                # the next request comes at once
    assert ran == ["ar"] * 3
    assert planner.slowdown("ar") == pytest.approx(2.0, rel=0.05)


def test_the_candidates_are_each_set_of_draft_lengths_on_the_grid_once_in_grid_order():
    """choose_plan scores every distinct set of draft lengths that a threshold and a cap on
    the grid give, under the first pair that gives it (the plan keeps that pair and applies
    it at every step), and builds no set twice."""
    from gateway.planner import THRESHOLDS, _candidates, _leading

    rng = random.Random(7)
    for _ in range(200):
        k_max = rng.randint(0, 8)
        reach = [sorted((rng.choice([0.0, 1.0, rng.random()]) for _ in range(rng.randint(0, k_max))), reverse=True)
                 for _ in range(rng.randint(1, 12))]
        grid = {}
        for threshold in THRESHOLDS:
            for cap in range(k_max + 1):
                ks = tuple(min(cap, _leading(r, threshold)) for r in reach)
                grid.setdefault(ks, (threshold, cap, ks))
        assert list(_candidates(reach, k_max)) == list(grid.values())


def test_requests_get_their_own_draft_lengths_within_their_caps():
    costs = StepCosts(2e-4, 5e-5, 0.0, 1e-3, 1e-4, 2e-4)
    planner = _planner_with(costs)
    requests = [_active(0), _active(1, max_draft=0), _active(2, max_draft=2)]
    plan = planner.replan(requests, K_MAX)
    assert plan.layout in ("sd", "psd")
    lengths = [planner.draft_length(r, K_MAX) for r in requests]
    assert 2 < lengths[0] <= K_MAX and lengths[1:] == [0, 2]   # the plan's own, speculation off, its cap
    assert planner.draft_length(requests[0], k_cap=0) == 0        # no drafter in the pool


def test_a_request_is_priced_within_its_whole_output_and_drafts_no_step_past_its_end():
    """A plan is a layout for the next seconds: a request a step or two from its end is
    priced at its cap within its whole output (max_tokens), as the others are, and one whose
    whole output is three tokens at two drafts at most; each step drafts no more than the
    request has left (Sequence.draft_length caps what it drafts)."""
    costs = StepCosts(2e-4, 5e-5, 0.0, 1e-3, 1e-4, 2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(3)] + [_active(3, max_tokens=3)]
    for req, left in zip(requests, (64, 3, 1, 3)):
        req.seq.output_token_ids.extend([5] * (req.seq.params.max_tokens - left))
    plan = planner.replan(requests, K_MAX)
    assert plan.layout in ("sd", "psd")
    ks = plan.draft_lengths
    assert ks["r0"] > 2 and ks["r1"] == ks["r2"] == ks["r0"]
    assert ks["r3"] <= 2
    assert [planner.draft_length(r, K_MAX) for r in requests[1:3]] == [min(2, ks["r1"]), 0]
    emitted = sum(1 + sum(planner.acceptance.reach(r.seq.stats)[:ks[r.request_id]]) for r in requests)
    assert plan.decode_tokens_per_s == pytest.approx(emitted / plan.step_s)


def test_requests_of_one_reach_are_planned_as_one_kind_each_keeping_its_own_draft_length():
    """choose_plan works out each distinct reach once (in plain decoding most requests share
    the pool's prior): interleaved kinds still get their own draft lengths, a kind counts as
    many times as it has requests, and psd splits the requests, not the kinds."""
    costs = StepCosts(1e-3, 1e-4, 1e-3, 5e-3, 1e-4, 1e-4)
    good, poor = (0.95,) * K_MAX, (0.0,) * K_MAX
    requests = [PlanRequest(f"r{i}", good if i % 3 else poor, K_MAX if i % 4 else 2) for i in range(12)]
    plan = choose_plan(costs, requests, K_MAX)
    assert plan.layout == "psd"
    assert 2 < plan.cap
    expected = {r.request_id: 0 if r.reach == poor else min(plan.cap, r.max_draft) for r in requests}
    assert plan.draft_lengths == expected
    assert sorted(len(b) for b in plan.batches) == [6, 6] and set(plan.batches[0]) | set(plan.batches[1]) == set(expected)
    emitted = sum(1 + sum(r.reach[:expected[r.request_id]]) for r in requests)
    assert plan.decode_tokens_per_s == pytest.approx(emitted / plan.step_s)
    alone = choose_plan(costs, requests[:1] + requests[1:2], K_MAX)      # one of each kind
    assert alone.draft_lengths == {"r0": 0, "r1": K_MAX}


def test_forced_cycle_rotates_every_layout():
    from gateway.auto import AutoPlanner

    planner = AutoPlanner(K_MAX, cycle_steps=2)
    seen = []
    for _ in range(12):
        if planner.replan_due(1):
            seen.append(planner.replan([_active(0)], K_MAX).layout)
        planner.observe_step(seen[-1], 0, 0, 1)
    assert set(seen) == {"ar", "sd", "psd"}


def test_a_close_contender_is_tried_until_measured_then_judged_on_its_measurements(clock):
    """A layout predicted nearly as fast as the best but never run: auto tries it until
    MEASURED_ENOUGH_S of it is measured, then judges it on what it measured (here: a third
    of the tokens predicted, so it is left)."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i, max_draft=1) for i in range(8)]
    best = choose_plan(costs, [PlanRequest(r.request_id, _reach(1.0), 1) for r in requests], K_MAX)
    contenders = [layout for layout, rate in best.considered.items()
                  if layout != best.layout and rate >= auto.EXPLORE_WITHIN * best.tokens_per_s]
    assert contenders, best.considered
    assert planner.replan(requests, K_MAX).layout == best.layout      # they just came: no trial yet
    spells = math.ceil(auto.MEASURED_ENOUGH_S / 0.16) + 1               # the first is not counted
    ran = _run_for(planner, clock, requests, 0.16, delivered=1 / 3, spells=spells)
    tried = ran[0]
    assert tried in contenders and set(ran) == {tried} and planner.explorations == 1
    last = planner.replan(requests, K_MAX)
    assert last.layout != tried
    assert planner.slowdown(tried) == pytest.approx(3.0, rel=0.05)
    # Every decision is on record (GetServerInfo, the bench's plot): what was chosen, whether
    # as a trial, and what each layout was predicted to give then.
    decisions = planner.describe(planning=True)[1].history
    assert [d.layout for d in decisions] == [best.layout, *ran, last.layout]
    assert [d.trying for d in decisions[:-1]] == ["", *[tried] * len(ran)]
    assert decisions[-1].trying in ("", last.layout)       # (the next contender's trial, maybe)
    assert dict(decisions[-1].layout_tokens_per_s) == pytest.approx(last.considered)
    assert all(d.requests == len(requests) for d in decisions)
    assert [d.at_s for d in decisions] == sorted(d.at_s for d in decisions)


def test_lent_cores_cost_the_own_cores_times_robust_ratios():
    """The lent cores' cost is the own-core fit times the median measured ratio: a slow first
    call after a switch (threads waking) changes nothing, even when it prefilled a wave of
    prompts (a separate fit once read that slow call as a price per prompt token and made
    plain decoding look 2.5x dearer). Prompt-heavy calls have a ratio of their own, from
    their prefill part: a large prefill uses the extra cores better than a decode step."""
    model = CostModel()
    own = StepCosts(0.0, 0.0, 0.0, 0.008, 0.0003, 0.0, verify_per_new_token=0.0002, verify_per_request=0.0001)
    for n in (1, 4, 16, 32):
        for new in (0, 100 * n):
            for k in (0, 2):
                model.observe_verify([k] * n, own.verify([k] * n, new), new_tokens=new)
    assert model.costs().borrowed_fixed is None                          # nothing lent yet
    model.observe_verify([0] * 4, 10 * own.verify([0] * 4, 400), new_tokens=400, borrowed=True)   # waking up
    for n in (4, 16, 32, 8):
        model.observe_verify([0] * n, 0.6 * own.verify([0] * n), borrowed=True)
    model.observe_verify([0] * 16, 0.6 * own.verify([0] * 16, 50), new_tokens=50, borrowed=True)
    lent = model.costs()
    for n, new in ((1, 0), (32, 0), (8, 800)):
        assert lent.verify([0] * n, new, borrowed=True) == pytest.approx(0.6 * own.verify([0] * n, new), rel=0.05)
    ratio = lent.borrowed_fixed / lent.verify_fixed
    assert lent.borrowed_per_new_token == pytest.approx(ratio * lent.verify_per_new_token)   # only the slow one
    assert lent.borrowed_per_token == pytest.approx(ratio * lent.verify_per_token)
    for n in (8, 16, 32):                                                # waves prefilled at 0.35x
        decode, prefill = own.verify([0] * n), own.verify([0] * n, 200 * n) - own.verify([0] * n)
        model.observe_verify([0] * n, 0.6 * decode + 0.35 * prefill, new_tokens=200 * n, borrowed=True)
    lent = model.costs()
    assert lent.borrowed_per_new_token == pytest.approx(0.35 * lent.verify_per_new_token, rel=0.05)
    assert lent.borrowed_fixed == pytest.approx(ratio * lent.verify_fixed, rel=0.05)


def _lent_model(ratio: float) -> tuple[CostModel, StepCosts]:
    """A model whose lent-core decode steps took `ratio` times the own cores' time."""
    from gateway.cost_model import OWN_PARTNERS

    model = CostModel()
    own = StepCosts(0.0, 0.0, 0.0, 0.008, 0.0003, 0.0, verify_per_request=0.0001)
    for _ in range(2):          # twice: a first reading of lending as slower is only a doubt
        for n in (1, 4, 16, 32):
            for k in (0,) * OWN_PARTNERS + (2,):
                model.observe_verify([k] * n, own.verify([k] * n))
        for n in (1, 4, 16, 32, 8) * 2:
            model.observe_verify([0] * n, ratio * own.verify([0] * n), borrowed=True)
    return model, own


@pytest.fixture
def every_call_counts(monkeypatch):
    """For tests of the lending judgement itself: every verify call counts, the first ones
    after a move onto the lent cores or off them too (cost_model.SWITCH_CALLS)."""
    from gateway import cost_model

    monkeypatch.setattr(cost_model, "SWITCH_CALLS", 0)


@pytest.mark.parametrize("ratio", [0.6, 1.4])
def test_plain_decoding_borrows_the_drafters_cores_only_where_that_was_measured_faster(ratio, every_call_counts):
    """On two crowded cores two threads decoded a few requests slower than one: plain
    decoding is then priced (and run) on the verifier's own cores."""
    assert CostModel().costs().lending_pays                    # not measured: try it
    model, own = _lent_model(ratio)
    costs = model.costs()
    assert costs.lent_ratio == pytest.approx(ratio, rel=0.1)            # (the own-core fit has a prior)
    assert costs.lending_pays == (ratio < 1)
    assert costs.plain_verify([0] * 8) == pytest.approx(min(ratio, 1.0) * own.verify([0] * 8), rel=0.1)
    plan = choose_plan(costs, [PlanRequest("r", (0.0,) * K_MAX, 0)], K_MAX)
    assert plan.layout == "ar" and plan.step_s == pytest.approx(costs.plain_verify([0]))


def test_calls_just_after_the_verifier_moves_cores_do_not_judge_lending():
    """The first SWITCH_CALLS verify calls after the verifier moves onto the lent cores or off
    them measure the move (threads migrating, OpenMP's worker waking or still spinning), not
    the cores: lent calls that run at 0.8 of the own cores' time once settled judge lending at
    0.8, however slow the calls right after each switch. Counted, windows of own-core steps
    between lent ones had lending judged slower (at C = 8, where `ar` on both cores ran 10-25%
    faster than auto on its own core)."""
    from gateway.cost_model import OWN_PARTNERS, SWITCH_CALLS

    model = CostModel()
    own = StepCosts(0.0, 0.0, 0.0, 0.008, 0.0003, 0.0)
    for _ in range(3):          # as the Batch Manager runs them: lent steps, then a window on the own cores
        for i in range(SWITCH_CALLS + 3):
            model.observe_verify([0] * 8, (1.6 if i < SWITCH_CALLS else 0.8) * own.verify([0] * 8), borrowed=True)
        for i in range(SWITCH_CALLS + OWN_PARTNERS):
            model.observe_verify([0] * 8, (1.5 if i < SWITCH_CALLS else 1.0) * own.verify([0] * 8))
    costs = model.costs()
    assert costs.lending_judged == pytest.approx(0.8) and costs.lending_pays
    assert costs.lent_ratio == pytest.approx(0.8, rel=0.05)


def test_a_few_slow_lent_calls_do_not_judge_lending(every_call_counts):
    """The start-up profile measures two or three lent-core calls, each just after a switch;
    slow ones once priced plain decoding 1.4x dearer and turned lending off for the rest of a
    run (auto ran sd at C = 1, 0.87x of plain decoding on both cores). Until LENT_JUDGED calls
    are measured, a ratio above 1 counts as 1; past that, it is the median's."""
    from gateway.cost_model import LENT_JUDGED, OWN_PARTNERS

    model = CostModel()
    own = StepCosts(0.0, 0.0, 0.0, 0.008, 0.0003, 0.0)
    for n in (1, 4, 16, 32) * OWN_PARTNERS:
        model.observe_verify([0] * n, own.verify([0] * n))
    for _ in range(LENT_JUDGED - 1):
        model.observe_verify([0], 1.5 * own.verify([0]), borrowed=True)
    costs = model.costs()
    assert costs.lent_ratio == pytest.approx(1.0) and costs.lending_pays
    assert costs.plain_verify([0]) == pytest.approx(costs.verify([0]))         # the own cores' price
    model.observe_verify([0], 1.5 * own.verify([0]), borrowed=True)
    costs = model.costs()                                   # a first reading: a doubt only
    assert model.lending_doubted_at is not None and costs.lent_ratio == pytest.approx(1.0) and costs.lending_pays
    for n in (1, 4) * OWN_PARTNERS:                         # confirmed beside own-core calls after it
        model.observe_verify([0] * n, own.verify([0] * n))
    for _ in range(LENT_JUDGED):
        model.observe_verify([0], 1.5 * own.verify([0]), borrowed=True)
    costs = model.costs()
    assert costs.lent_ratio > 1.2 and not costs.lending_pays and model.lending_doubted_at is None
    assert not model.lending_pays
    for _ in range(2 * LENT_JUDGED + 1):                             # faster ones outvote them
        model.observe_verify([0], 0.7 * own.verify([0]), borrowed=True)
    assert model.costs().lending_pays and model.lending_pays


def test_lending_is_judged_beside_own_core_plain_steps_of_its_batch_not_on_the_fit(every_call_counts):
    """The own-core fit, fitted on drafting steps, may under-price plain decoding: lent calls
    then read slower than it, but lending is judged slower only against own-core plain steps
    of about the same batch (a psd trial once reshaped the fit and turned lending off for
    the rest of a run). Until judged, the lent cores are priced at most at the own cores'."""
    model = CostModel()
    own = StepCosts(0.0, 0.0, 0.0, 0.008, 0.0003, 0.0)
    for n in (1, 4, 16, 32):
        for _ in range(4):
            model.observe_verify([2] * n, own.verify([2] * n))        # drafting steps only
    for n in (4, 16) * 8:
        model.observe_verify([0] * n, 1.3 * own.verify([0] * n), borrowed=True)
    costs = model.costs()
    assert costs.lending_judged is None and costs.lending_pays
    assert costs.plain_verify([0] * 4) <= costs.verify([0] * 4) * 1.001
    for n in (4, 5, 16) * 3:                                # plain decoding on one core: dearer still
        model.observe_verify([0] * n, 2.0 * own.verify([0] * n))
    costs = model.costs()
    assert costs.lending_judged == pytest.approx(0.65, rel=0.05) and costs.lending_pays
    for n in (4, 16) * 8:                                   # ... or cheaper: lending loses,
        model.observe_verify([0] * n, 0.5 * own.verify([0] * n))
    assert model.lending_doubted_at is not None and model.costs().lending_pays     # first a doubt,
    for n in (4, 16) * 4:                                   # confirmed by lent calls after it
        model.observe_verify([0] * n, 1.3 * own.verify([0] * n), borrowed=True)
    costs = model.costs()
    assert costs.lending_judged > 1.5 and not costs.lending_pays
    assert costs.plain_verify([0] * 4) == pytest.approx(costs.verify([0] * 4))
    from gateway.auto import AutoPlanner                    # GetServerInfo shows the judgement
    planner = AutoPlanner(K_MAX)
    planner.model = model
    shown = planner.describe(planning=False)[0]
    assert shown.lending_judged == pytest.approx(costs.lending_judged)
    assert shown.verify_per_request_s == pytest.approx(costs.verify_per_request)
    assert not AutoPlanner(K_MAX).describe(planning=False)[0].HasField("lending_judged")


def test_lending_is_judged_only_beside_own_core_steps_that_ran_near_it(monkeypatch, every_call_counts):
    """The start-up profile's own-core steps, on short synthetic prompts, ran faster than
    lent steps of real requests seconds later, and lending was judged slower (auto decoded on
    one core at 0.72 of fixed ar). A lent step is compared only with own-core steps within
    PAIRED_WITHIN_S of it; a judgement stands until enough such pairs judge afresh."""
    from gateway import cost_model
    from gateway.cost_model import LENT_JUDGED, LENT_WINDOW, OWN_PARTNERS, PAIRED_WITHIN_S

    now = [100.0]
    monkeypatch.setattr(cost_model.time, "monotonic", lambda: now[0])
    model = CostModel()
    for _ in range(OWN_PARTNERS):                           # the profile: short contexts, fast
        model.observe_verify([0] * 8, 0.004)
    now[0] += 2 * PAIRED_WITHIN_S
    for _ in range(2 * LENT_JUDGED):                        # real requests on the lent cores
        model.observe_verify([0] * 8, 0.006, borrowed=True)
    assert model.costs().lending_judged is None and model.costs().lending_pays
    for _ in range(OWN_PARTNERS):                           # the same requests on the own cores
        model.observe_verify([0] * 8, 0.009)
    assert model.costs().lending_judged == pytest.approx(0.006 / 0.009)
    now[0] += 10 * PAIRED_WITHIN_S                          # lending on, no own-core step near:
    for _ in range(LENT_WINDOW):                            # the judgement stands
        model.observe_verify([0] * 8, 0.007, borrowed=True)
    assert model.costs().lending_judged == pytest.approx(0.006 / 0.009)
    for _ in range(OWN_PARTNERS):                           # read afresh beside new own steps: a doubt ...
        model.observe_verify([0] * 8, 0.0056)
    assert model.lending_doubted_at == now[0] and model.costs().lending_pays
    now[0] += 0.1
    for _ in range(LENT_JUDGED):                            # ... that lent steps after it confirm
        model.observe_verify([0] * 8, 0.007, borrowed=True)
    assert model.costs().lending_judged == pytest.approx(1.25) and not model.costs().lending_pays


def test_a_judgement_that_lending_is_slower_lapses_unless_renewed(monkeypatch, every_call_counts):
    """Lending judged slower (made, say, while another process held the cores) stands for
    SLOWER_JUDGED_FOR_S; with no new judgement by then lending is presumed again, and plain
    decoding priced at the lent cores' own ratio (at most the own cores' price), until lent
    and own-core steps side by side judge afresh. Kept for good, it priced plain decoding on
    one core after the contention had ended, and auto ran psd at 0.86 of plain decoding."""
    from gateway import cost_model
    from gateway.cost_model import LENT_JUDGED, LENT_WINDOW, OWN_PARTNERS, SLOWER_JUDGED_FOR_S

    now = [100.0]
    monkeypatch.setattr(cost_model.time, "monotonic", lambda: now[0])
    model = CostModel()
    for _ in range(OWN_PARTNERS):
        model.observe_verify([0] * 8, 0.004)
    for _ in range(LENT_JUDGED):                            # lent steps slowed by contention ...
        model.observe_verify([0] * 8, 0.008, borrowed=True)
    assert model.lending_doubted_at is not None and model.costs().lending_pays
    now[0] += 0.1
    for _ in range(LENT_JUDGED):                            # ... and still, just after
        model.observe_verify([0] * 8, 0.008, borrowed=True)
    costs = model.costs()
    assert costs.lending_judged == pytest.approx(2.0) and not costs.lending_pays and not model.lending_pays
    assert costs.plain_verify([0] * 8) == pytest.approx(costs.verify([0] * 8))          # the own cores
    now[0] += SLOWER_JUDGED_FOR_S / 2
    assert not model.costs().lending_pays and not model.lending_pays     # (the latter without a fit)
    model.observe_verify([0] * 8, 0.005, borrowed=True)     # a lent step with no own-core step near:
    assert not model.costs().lending_pays                   # judged again on the old steps, as old
    now[0] += SLOWER_JUDGED_FOR_S / 2 + 1
    costs = model.costs()
    assert costs.lending_judged is None and costs.lending_pays and model.lending_pays
    assert costs.plain_verify([0] * 8) == pytest.approx(costs.verify([0] * 8, borrowed=True))
    assert costs.verify([0] * 8, borrowed=True) <= costs.verify([0] * 8)
    for _ in range(OWN_PARTNERS):                           # judged afresh: slower again (twice)
        model.observe_verify([0] * 8, 0.004)
    for _ in range(LENT_WINDOW):
        model.observe_verify([0] * 8, 0.006, borrowed=True)
    assert model.lending_doubted_at is not None and model.costs().lending_pays
    now[0] += 0.1
    for _ in range(LENT_JUDGED):
        model.observe_verify([0] * 8, 0.006, borrowed=True)
    assert model.costs().lending_judged == pytest.approx(1.5) and not model.costs().lending_pays


def _auto_manager():
    from gateway import batch_manager
    from gateway.batch import BatchManagerConfig
    from gateway.pool import DrafterPool
    from minedraft.v1 import engine_pb2

    return batch_manager.BatchManager(BatchManagerConfig(mode="auto", k=2, max_batch=4, kv_blocks=1000,
                                                         block_size=16, step_timeout_s=5.0),
                                      None, DrafterPool(engine_pb2.EngineInfo(data_plane="gloo")))


def test_while_lending_pays_a_few_plain_steps_run_on_the_own_cores_now_and_then(monkeypatch):
    """Own-core plain steps are what lending is judged beside, and while it pays none run
    otherwise: OWN_WINDOW of them every LEND_RECHECK_S of plain decoding, idle time between
    steps not counted."""
    from gateway import batch_manager

    now = [100.0]
    monkeypatch.setattr(batch_manager.time, "monotonic", lambda: now[0])
    manager = _auto_manager()
    manager.planner.model, _ = _lent_model(0.6)
    assert manager.planner.costs().lending_pays
    per_window = int(batch_manager.LEND_RECHECK_S / 0.01)

    def steps(n: int) -> list[bool]:
        lent = []
        for _ in range(n):
            now[0] += 0.01                          # a step every 10 ms
            lent.append(manager._lend())
        return lent

    assert all(steps(per_window - 10))
    for _ in range(3):
        now[0] += batch_manager.LEND_RECHECK_S + 1      # idle: no window owed for it
        assert all(steps(5))
        lent = steps(per_window)
        first = lent.index(False)
        assert lent[first:first + batch_manager.OWN_WINDOW] == [False] * batch_manager.OWN_WINDOW
        assert lent.count(False) == batch_manager.OWN_WINDOW


def test_steps_that_prefill_borrow_the_lent_cores_even_in_an_own_core_window(monkeypatch):
    """A step carrying new requests' prompts borrows while lending pays: a window owed or
    under way waits for the steps that only decode (it is those that lending is judged by),
    and still runs OWN_WINDOW of them."""
    from gateway import batch_manager

    now = [100.0]
    monkeypatch.setattr(batch_manager.time, "monotonic", lambda: now[0])
    manager = _auto_manager()
    manager.planner.model, _ = _lent_model(0.6)

    def step(prefills: bool = False) -> bool:
        now[0] += 0.01
        return manager._lend(prefills=prefills)

    while step():                                   # lent decoding until a window is owed ...
        pass                                        # ... and its first step ran on the own cores
    assert all(step(prefills=True) for _ in range(3))       # a wave of prompts comes in: lent
    window = [step() for _ in range(3)] + [step(prefills=True)] + [step() for _ in range(batch_manager.OWN_WINDOW)]
    assert window == [False] * 3 + [True] + [False] * (batch_manager.OWN_WINDOW - 4) + [True] * 4
    now[0] += 5.0                                   # idle, then a window owed at a wave's start
    manager._lent_decoding_s = batch_manager.LEND_RECHECK_S
    assert step(prefills=True) and not step()


def test_lending_measured_slower_is_tried_again_now_and_then(monkeypatch, every_call_counts):
    """Plain steps stop borrowing once lending was measured slower, and borrow again for a
    window of steps (enough to renew the measured ratio) LEND_FIRST_RECHECK_S after the last
    lent step, then four times as long after each re-check that found it slower still, up to
    LEND_RECHECK_S; once it pays again the next slower reading starts the waits afresh."""
    from gateway import batch_manager, cost_model
    from gateway.batch_manager import LEND_FIRST_RECHECK_S, LEND_RECHECK_S
    from gateway.cost_model import LENT_WINDOW

    slower, _ = _lent_model(1.4)            # (on the real clock: its readings need time to pass)
    monkeypatch.setattr(cost_model, "SLOWER_JUDGED_FOR_S", float("inf"))   # (the judgement's lapse aside)
    now = [100.0]
    monkeypatch.setattr(batch_manager.time, "monotonic", lambda: now[0])
    manager = _auto_manager()
    assert manager._lend()                                          # never measured: lend
    manager.planner.model = slower
    assert not slower.costs().lending_pays

    def rechecked_after() -> float:
        """Seconds from the last lent step to the next re-check's window (which is run)."""
        last = slower.lent_observed_at = now[0]
        while not manager._lend():
            now[0] += 0.05
        assert all(manager._lend() for _ in range(LENT_WINDOW - 1))     # the window ...
        slower.lent_observed_at = now[0]                                # (its steps came back)
        assert not manager._lend()                                      # ... and no more
        return now[0] - last

    waits = [rechecked_after() for _ in range(4)]
    assert waits == pytest.approx([LEND_FIRST_RECHECK_S, 4 * LEND_FIRST_RECHECK_S, LEND_RECHECK_S,
                                   LEND_RECHECK_S], abs=0.06)
    manager.planner.model, _ = _lent_model(0.6)
    assert manager._lend()                                          # (no own-core window is due)
    manager.planner.model = slower
    assert rechecked_after() == pytest.approx(LEND_FIRST_RECHECK_S, abs=0.06)


def test_a_first_reading_of_lending_as_slower_runs_an_own_core_window_at_once(caplog, monkeypatch, every_call_counts):
    """A doubt about lending is settled by own-core steps run right away and the lent steps
    after them, not half a minute later: OWN_WINDOW plain steps on the own cores, once per
    doubt, then lending again; confirmed, plain decoding stops borrowing."""
    from gateway import batch_manager
    from gateway.cost_model import LENT_JUDGED, OWN_PARTNERS

    caplog.set_level(logging.INFO, logger="minedraft.gateway")
    monkeypatch.setattr(batch_manager, "LEND_FIRST_RECHECK_S", 60.0)     # (no re-check on a slow machine)
    manager = _auto_manager()
    model = manager.planner.model
    for _ in range(OWN_PARTNERS):
        model.observe_verify([0] * 4, 0.004)
    assert manager._lend()
    for _ in range(LENT_JUDGED):                            # lent steps slowed for a moment
        model.observe_verify([0] * 4, 0.008, borrowed=True)
    assert model.lending_doubted_at is not None and model.costs().lending_pays
    lent = [manager._lend() for _ in range(batch_manager.OWN_WINDOW + 3)]
    assert lent == [False] * batch_manager.OWN_WINDOW + [True] * 3
    for _ in range(OWN_PARTNERS):                           # the window's steps came back ...
        model.observe_verify([0] * 4, 0.004)
    for _ in range(LENT_JUDGED):                            # ... and lent ones as fast as before
        model.observe_verify([0] * 4, 0.003, borrowed=True)
    assert model.lending_doubted_at is None and model.costs().lending_judged == pytest.approx(0.75)
    assert all(manager._lend() for _ in range(20))          # no window for a doubt cleared

    for _ in range(LENT_JUDGED):                            # slower again: a new doubt, a new window
        model.observe_verify([0] * 4, 0.009, borrowed=True)
    assert model.lending_doubted_at is not None
    assert [manager._lend() for _ in range(batch_manager.OWN_WINDOW + 1)] == [False] * batch_manager.OWN_WINDOW + [True]
    for _ in range(OWN_PARTNERS):
        model.observe_verify([0] * 4, 0.004)
    for _ in range(LENT_JUDGED):                            # still slower: confirmed
        model.observe_verify([0] * 4, 0.009, borrowed=True)
    assert model.lending_doubted_at is None and not model.costs().lending_pays
    assert not manager._lend()
    said = [r.getMessage() for r in caplog.records]
    assert sum("confirming" in m for m in said) == 2
    assert sum("stays on the verifier's own cores" in m for m in said) == 1


def test_prompts_weigh_on_each_layout_at_its_own_prefill_cost():
    """Every output token carries its share of prompt prefill (rho prompt tokens per output
    token) at the layout's own price: plain decoding on the lent cores, sd on the verifier
    then the drafter, psd on both at once. A prompt-heavy workload can tip the choice."""
    base = dict(draft_per_forward=5e-4, draft_per_token=5e-5, draft_fixed=1e-3, verify_fixed=10e-3,
                verify_per_token=3e-4, gateway_per_step=1e-3, borrowed_fixed=8e-3, borrowed_per_token=2e-4,
                draft_per_new_token=1e-4, verify_per_new_token=3e-4, borrowed_per_new_token=1.5e-4)
    light = StepCosts(**base, prompt_per_output=1.0)
    heavy = StepCosts(**base, prompt_per_output=4.0)
    assert [heavy.prefill_per_token(layout) for layout in ("ar", "sd", "psd")] == pytest.approx([1.5e-4, 4e-4, 3e-4])
    assert heavy.serving_rate("sd", 1000.0) == pytest.approx(1 / (1 / 1000 + 4 * 4e-4))
    requests = _requests(8, 0.9)
    light_plan, heavy_plan = choose_plan(light, requests, K_MAX), choose_plan(heavy, requests, K_MAX)
    decode_ar = 1 / (1 / light_plan.considered["ar"] - 1.5e-4)
    assert heavy_plan.considered["ar"] == pytest.approx(1 / (1 / decode_ar + 4 * 1.5e-4))
    assert light_plan.layout == "psd" and heavy_plan.layout == "ar"


def test_the_workload_ratio_of_prompt_to_output_tokens():
    """Prompt over output tokens of the last requests admitted, a running request's max_tokens
    standing in for its output: a four-token warm-up barely moves it."""
    model = CostModel()
    assert model.prompt_per_output() == 0.0
    model.observe_admitted("warm-up", prompt_tokens=90, max_tokens=4)
    model.observe_finished("warm-up", 4)
    assert model.prompt_per_output() == pytest.approx(90 / 4)
    for i in range(63):
        model.observe_admitted(f"r{i}", prompt_tokens=90, max_tokens=64)
    assert model.prompt_per_output() == pytest.approx(64 * 90 / (4 + 63 * 64))
    for i in range(63):
        model.observe_finished(f"r{i}", 32)                       # they stopped early
    assert model.prompt_per_output() == pytest.approx(64 * 90 / (4 + 63 * 32))
    model.observe_admitted("next", prompt_tokens=90, max_tokens=64)   # the warm-up leaves the window
    assert model.prompt_per_output() == pytest.approx(64 * 90 / (63 * 32 + 64))


def test_a_layout_measured_slow_is_rechecked_now_and_then_one_that_loses_as_predicted_only_as_the_floor(clock, no_first_trial_of_sd, budget_of_5_percent):
    """A model wrong about a layout auto no longer runs would never learn better: psd, the
    best as predicted but measured delivering 0.6 of it, is left, then tried again after a
    while, twice as long later while it keeps losing. A layout that loses as predicted is not
    tried on waiting alone (trials of such layouts ran a fifth to a half slower than the plan
    for up to a second of every short run), except plain decoding, the floor: predicted at
    0.75-0.9 of the best, it is tried once (the baseline is measured while it is anywhere
    near) and then only once FLOOR_STALE_S has passed without a measurement, ever more
    rarely while it keeps losing; it is never chosen."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]

    run = _spell_runner(planner, clock, requests, {"psd": 0.6})
    ran = [run(1.0) for _ in range(6)]
    assert ran[0] == "psd" and "ar" in ran and ran[-1] == "sd", ran     # psd measured slow: left for sd;
    ar_tries = [d.trying for d in planner.history if d.trying == "ar"]  # plain decoding measured once
    assert ar_tries and len(ar_tries) == ran.count("ar")
    tried_at: dict[str, list[float]] = {"psd": [], "ar": []}
    was_trying = None
    for _ in range(round(500 / 0.5)):
        layout = run(0.5)
        trying = layout if planner._exploring is not None and layout == planner._exploring[0] else None
        if trying and trying != was_trying:
            tried_at[trying].append(clock[0])
        was_trying = trying
        assert layout != "ar" or trying == "ar"
    decisions = [d for d in planner.history if not d.trying]
    assert all(d.layout_tokens_per_s["ar"] < auto.EXPLORE_WITHIN * max(d.layout_tokens_per_s.values())
               for d in decisions)                            # plain decoding: no contender
    assert any(d.layout_tokens_per_s["psd"] < auto.EXPLORE_WITHIN * d.layout_tokens_per_s["sd"]
               for d in decisions)                            # psd only on a re-check
    assert {d.trying for d in planner.history} <= {"", "psd", "ar"}   # (the latest decisions kept)
    for layout, at in tried_at.items():                       # ever rarer (each trial's wait doubles;
        assert len(at) >= 4, (layout, at)                      # one may be put off while the other's
        gaps = [b - a for a, b in zip(at, at[1:])]             # spends the budget)
        assert gaps[-1] > 2 * gaps[0] and gaps[-1] == max(gaps), (layout, gaps)
    assert min(b - a for a, b in zip(tried_at["ar"], tried_at["ar"][1:])) > auto.FLOOR_STALE_S
    assert planner.plan.layout == "sd"


def test_plain_decoding_predicted_behind_is_measured_and_chosen_where_it_delivers_more(clock):
    """The baseline auto must not lose to, like any layout never measured, is tried from
    further behind than a measured one (FIRST_EXPLORE_WITHIN): predicted at 0.75-0.9 of psd but delivering
    1.5x its prediction (at C = 32 plain decoding was predicted a quarter below what it
    delivered and never tried), it is measured, then chosen and kept."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=8e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    first = planner.replan(requests, K_MAX)
    ratio = first.considered["ar"] / first.tokens_per_s
    assert first.layout == "psd" and auto.FIRST_EXPLORE_WITHIN <= ratio < auto.EXPLORE_WITHIN

    run = _spell_runner(planner, clock, requests, {"ar": 1.5})
    ran = [run(0.5) for _ in range(40)]
    assert ran[0] == "ar", ran                                   # tried first, predicted behind
    assert ran[-20:].count("ar") >= 18 and ran[-1] == "ar", ran  # chosen (sd re-checked once)
    assert planner.slowdown("ar") == pytest.approx(1 / 1.5, rel=0.05)


def test_a_measured_layout_is_judged_at_its_measured_rate_while_the_model_moves(clock):
    """What a layout delivered is read against today's model, so its estimate stays what it
    measured when the model's prediction moves (with every call the fits and the lent-core
    ratio move: plain decoding's prediction swung 235-314 tok/s between plans at C = 2 with
    nothing else changed, and a slowdown read against each spell's own prediction carried
    that swing into the choice)."""
    costs = StepCosts(draft_per_forward=5e-3, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    assert set(_run_for(planner, clock, requests, 0.5, delivered=1.2, spells=6)) == {"ar"}
    measured = planner.replan(requests, K_MAX).considered["ar"]
    assert planner.slowdown("ar") == pytest.approx(1 / 1.2, rel=0.03)
    dearer = StepCosts(draft_per_forward=5e-3, draft_per_token=5e-5, draft_fixed=0.0,
                       verify_fixed=1.3e-3, verify_per_token=1.3e-4, gateway_per_step=2e-4)
    planner.model = _planner_with(dearer).model             # the model now says 1.3x dearer
    assert planner.slowdown("ar") == pytest.approx(1 / 1.2 / 1.3, rel=0.03)
    assert planner.replan(requests, K_MAX).considered["ar"] == pytest.approx(measured, rel=0.02)


def test_a_layout_slowed_only_as_much_as_the_best_is_not_rechecked(clock, no_first_trial_of_sd):
    """Every layout ran 1.3x slower than the cost model says (the machine's doing, not a
    layout's): sd, predicted at three quarters of psd, is as far behind as its measurement
    says and is not tried again, however long it goes unmeasured (its slowdown set aside
    alone would flatter it against a best still slowed)."""
    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    for _ in range(3):                                      # 1.2 s of sd, 1.3x slow
        planner._measured["sd"].append(_measured_spell(planner, requests, "sd", clock[0], 0.3, 0.39))
    ran = _run_for(planner, clock, requests, 0.5, delivered=1 / 1.3, spells=120)
    assert set(ran) - {"ar"} == {"psd"}                     # (plain decoding re-checked as the floor)
    assert all(d.trying == "ar" for d in planner.history if d.layout == "ar")
    assert planner.slowdown("psd") == pytest.approx(1.3, rel=0.02)
    assert planner.slowdown("sd") == pytest.approx(1.3, rel=0.01)
    assert not any(d.trying == "sd" for d in planner.history)


def test_a_burst_of_prompts_counts_at_its_own_rate():
    """Prompts that arrive at once after a quiet spell weigh as a burst (their tokens over a
    second), not spread over the whole window; steady arrivals average over the window."""
    model = CostModel()
    model.observe_prompts(5000, now=100.0)                  # long ago: out of the window
    model.observe_prompts(1600, now=200.0)
    assert model.prompt_tokens_per_s(now=200.1) == pytest.approx(1600)
    for second in range(1, 11):
        model.observe_prompts(100, now=300.0 + second)
    assert model.prompt_tokens_per_s(now=311.0) == pytest.approx(1000 / 10)


def test_a_plan_is_remade_at_once_when_the_running_requests_change_a_lot(monkeypatch):
    """A plan made for one request must not run a burst of sixty-four until the next
    interval: a change of a quarter (at least two requests) replans at once."""
    from gateway import auto

    clock = [50.0]
    monkeypatch.setattr(auto.time, "monotonic", lambda: clock[0])
    planner = auto.AutoPlanner(K_MAX)
    planner.replan([_active(0)], K_MAX)
    assert not planner.replan_due(1) and not planner.replan_due(2)
    assert planner.replan_due(64)
    planner.replan([_active(i) for i in range(64)], K_MAX)
    assert not planner.replan_due(60) and planner.replan_due(40)
    clock[0] += planner.replan_interval_s
    assert planner.replan_due(64)


def test_a_wave_of_prefills_is_priced_at_the_layouts_own_prefill_cost(clock, monkeypatch, no_first_trial_of_sd):
    """Prompts prefilled while a layout is in force cost it their prefill at that layout's
    price, not a slowdown: a spell that took exactly its decode time plus that price is on
    time; waves that took twice as long read as prefill dearer than priced."""
    from gateway import auto

    monkeypatch.setattr(auto, "EXPLORE_WITHIN", 2.0)         # no trials of other layouts here
    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0, verify_fixed=1e-3,
                      verify_per_token=1e-4, gateway_per_step=2e-4, verify_per_new_token=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    layout = _run_for(planner, clock, requests, 0.2, delivered=1.0, spells=2)[0]     # (enough measured)
    for burst, stretch in ((0, 1.0), (2000, 1.0), (2000, 1.0), (0, 1.0), (2000, 2.0), (2000, 2.0)):
        plan = planner.replan(requests, K_MAX)
        assert plan.layout == layout
        planner.observe_step(layout, round(planner.plan.decode_tokens_per_s * 0.1), burst, _batch(layout, requests))
        clock[0] += (0.1 + burst * planner.costs().prefill_per_token(layout)) * stretch
        if stretch == 1.0 and burst:
            planner.replan(requests, K_MAX)
            assert planner.slowdown(layout) == pytest.approx(1.0, rel=0.02)
    planner.replan(requests, K_MAX)
    assert planner.prefill_slowdown(layout) > 1.3


def test_a_drafter_far_behind_makes_drafting_pay_its_catch_up_first():
    """psd wins on its steps, but moving to it from plain decoding means the drafter first
    catches up with every token verified meanwhile: spread over the horizon, a catch-up as
    long as the horizon halves psd's rate and plain decoding stays."""
    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4,
                      borrowed_fixed=1e-3, borrowed_per_token=1e-4)
    requests = _requests(8, 0.95)
    free = choose_plan(costs, requests, K_MAX)
    assert free.layout == "psd" and free.tokens_per_s < 2 * free.considered["ar"]
    behind = choose_plan(costs, requests, K_MAX, switch_s={"sd": 5.0, "psd": 5.0}, horizon_s=5.0)
    assert behind.layout == "ar"
    assert behind.considered["psd"] == pytest.approx(free.tokens_per_s / 2)
    # Plain decoding going on meanwhile (on the own cores) earns its tokens during the
    # catch-up: half the horizon at each rate; never more than the layout's own.
    plain = free.considered["ar"]
    beside = choose_plan(costs, requests, K_MAX, switch_s={"sd": 5.0, "psd": 5.0}, horizon_s=5.0,
                         meanwhile_tokens_per_s=plain / 2)
    assert beside.considered["psd"] == pytest.approx((free.tokens_per_s + plain / 2) / 2)
    assert beside.considered["ar"] == pytest.approx(plain)
    faster = choose_plan(costs, requests, K_MAX, switch_s={"sd": 5.0, "psd": 5.0}, horizon_s=5.0,
                         meanwhile_tokens_per_s=10 * free.tokens_per_s)
    assert faster.considered["psd"] == pytest.approx(free.tokens_per_s)


def test_the_catch_up_is_counted_only_when_leaving_plain_decoding():
    from gateway.auto import AutoPlanner

    planner = AutoPlanner(K_MAX)
    per_token = planner.costs().draft_per_new_token
    fresh, behind, off = _active(0), _active(1), _active(2, max_draft=0)    # 3 prompt tokens each
    behind.known_to_drafter, behind.pending_diff = True, [7] * 100
    cost, meanwhile = planner._switch_s([fresh, behind, off])
    assert per_token > 0 and cost["psd"] == cost["sd"] == pytest.approx(per_token * (3 + 100))
    # The prior's catch-up of 103 tokens outlasts a plain step of the three: plain decoding
    # goes on meanwhile, on the own cores.
    costs = planner.costs()
    assert costs.draft([0], 103) > costs.verify([0] * 3)
    assert meanwhile == pytest.approx(3 / costs.verify([0] * 3))
    behind.pending_diff = []
    assert planner._switch_s([behind])[1] == 0.0        # nothing to catch up: no plain step meanwhile
    planner.plan = choose_plan(planner.costs(), _requests(8, 0.95), K_MAX, layouts=("psd",))
    assert planner._switch_s([fresh, behind, off]) == ({}, 0.0)


def test_a_switch_is_not_judged_until_its_layouts_steps_came_back(clock, no_first_trial_of_sd):
    """The drafter's catch-up makes the first steps after a switch slow; spells that begin
    before SETTLE_STEPS steps of the new layout came back are not counted, however long."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    layout = planner.replan(requests, K_MAX).layout
    settle = auto.SETTLE_STEPS[layout]
    assert settle >= 2
    for _ in range(3):                                  # three long spells, no step back yet
        clock[0] += 1.0
        planner.replan(requests, K_MAX)
    for _ in range(settle - 1):                         # all but one of the settling steps
        planner.observe_step(layout, 10, 0, _batch(layout, requests))
    clock[0] += 1.0
    planner.replan(requests, K_MAX)
    assert planner.slowdown(layout) == 1.0 and not planner._measured[layout]
    planner.observe_step(layout, 10, 0, _batch(layout, requests))                 # settled: the next spell counts
    clock[0] += 1.0
    planner.replan(requests, K_MAX)
    assert planner.slowdown(layout) == 1.0 and not planner._measured[layout]
    _run_for(planner, clock, requests, 0.5, delivered=0.5)
    planner.replan(requests, K_MAX)
    assert planner.slowdown(layout) == pytest.approx(2.0, rel=0.02)


def test_plain_decoding_after_drafting_is_judged_only_once_settled_in_time(clock, no_first_trial_of_sd):
    """Plain steps on the lent cores run slow for a while after drafting, however short the
    steps: a spell of plain decoding that begins less than SETTLE_S["ar"] after the switch is
    not counted, however many of its steps came back; the first one after that is."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    assert planner.replan(requests, K_MAX).layout != "ar"
    clock[0] += 1.0
    assert planner.replan(requests, 0).layout == "ar"         # no drafter can draft: plain decoding
    settle_s = auto.SETTLE_S["ar"]
    assert settle_s > 0.1
    spell_s = 0.4 * settle_s

    def spell() -> None:                                       # many steps, each giving a token a request
        for _ in range(4 * auto.SETTLE_STEPS["ar"]):
            planner.observe_step("ar", len(requests), 0, len(requests))
        clock[0] += spell_s
        planner.replan(requests, 0)

    spell()                                                    # the switch's own spell ...
    spell()                                                    # ... and those begun 0.4 and 0.8
    spell()                                                    # of SETTLE_S after it
    assert not planner._measured["ar"]
    spell()                                                    # begun 1.2 of it after: counted
    assert len(planner._measured["ar"]) == 1


def _pool_of_good_and_bad(planner, good: float = 0.9, bad: float = 0.1) -> None:
    """The planner's acceptance estimate as after 16 requests, half drafting well and half badly."""
    from gateway.acceptance_estimate import AcceptanceEstimate
    from minedraft.metrics import AcceptanceStats

    rng, planner.acceptance = random.Random(0), AcceptanceEstimate(K_MAX)
    for rate in [good, bad] * 8:
        stats = AcceptanceStats()
        for _ in range(8):
            planner.acceptance.record(stats, K_MAX, next((j for j in range(K_MAX) if rng.random() >= rate), K_MAX))


def test_a_fresh_request_gets_a_short_trial_of_drafting_where_plain_decoding_would_never_measure_it(clock, no_trials,
                                                                                                    monkeypatch):
    """Half the pool drafts at 0.9 and half at 0.1: priced at the pool's mean, sd is behind
    plain decoding for a newcomer, which plain decoding never measures. Priced hopefully, sd is
    well ahead: the newcomer drafts until its own record tells (MIN_REQUEST_STEPS steps, a bad
    one too, though its first rejections soon take its hopeful price below the margin), and
    the plan then follows it: back to plain decoding for a bad one, sd for a good one. The
    trial's spells are not counted. Where requests are alike there is no trial, nor where the
    hope does not put drafting TRIAL_MARGIN ahead."""
    from gateway import auto
    from gateway.acceptance_estimate import AcceptanceEstimate

    costs = StepCosts(draft_per_forward=0.01, draft_per_token=0.001, draft_fixed=0.0,
                      verify_fixed=0.1, verify_per_token=0.05, gateway_per_step=0.001)
    planner = _planner_with(costs)
    _pool_of_good_and_bad(planner)

    def trial_then(accepted: int) -> str:
        request = _active(len(planner.history))
        plan = planner.replan([request], K_MAX)
        assert plan.layout == "sd" and planner.history[-1].trying == "sd"
        assert plan.considered["sd"] < auto.SWITCH_MARGIN * plan.considered["ar"]   # at the pool's mean: not enough
        assert planner.draft_length(request, K_MAX) == plan.draft_lengths[request.request_id] >= 2
        assert request.draft_reach == planner.acceptance.reach(request.seq.stats, hopeful=True)    # k at the hope
        for _ in range(AcceptanceEstimate.MIN_REQUEST_STEPS):
            assert planner.plan.layout == "sd"          # the trial goes on while the request is fresh
            clock[0] += 0.25
            planner.acceptance.record(request.seq.stats, K_MAX, accepted)
            planner.observe_step("sd", 1 + accepted, 0, 1, expected=1.0 + accepted)
            planner.replan([request], K_MAX)
        assert not planner.acceptance.fresh(request.seq.stats)
        return planner.plan.layout

    assert trial_then(accepted=0) == "ar"
    assert planner.request_trials == 1
    assert not planner._measured["sd"]              # the trial's spells: not the layout's pace
    clock[0] += 1.0
    assert trial_then(accepted=K_MAX) == "sd"
    assert planner.request_trials == 2

    alike = _planner_with(costs)
    _pool_of_good_and_bad(alike, good=0.5, bad=0.5)
    assert alike.replan([_active(0)], K_MAX).layout == "ar" and alike.request_trials == 0

    monkeypatch.setattr(auto, "TRIAL_MARGIN", 10.0)
    differ = _planner_with(costs)
    _pool_of_good_and_bad(differ)
    assert differ.replan([_active(0)], K_MAX).layout == "ar" and differ.request_trials == 0


def test_of_several_fresh_requests_one_is_priced_hopefully_when_a_trial_is_weighed(clock, no_trials):
    """The hope is a request one standard deviation above the mean, about one in six: with four
    newcomers, drafting priced for all four at the hope would be past TRIAL_MARGIN here
    (verifying more tokens costs little, drafting a forward a good deal), priced for one of
    them it is not, and plain decoding stays; alone, a newcomer gets its trial."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=0.04, draft_per_token=0.001, draft_fixed=0.0,
                      verify_fixed=0.1, verify_per_token=0.01, gateway_per_step=0.001)
    planner = _planner_with(costs)
    _pool_of_good_and_bad(planner)
    requests = [_active(i) for i in range(4)]
    every_one_hoped = [PlanRequest(r.request_id, planner.acceptance.reach(r.seq.stats, hopeful=True), K_MAX)
                       for r in requests]
    all_hopeful = choose_plan(planner.costs(), every_one_hoped, K_MAX, layouts=("sd", "psd"))
    planner.replan(requests, K_MAX)                 # (their arrival: no trial as a wave comes in)
    clock[0] += 0.5
    plan = planner.replan(requests, K_MAX)
    assert all_hopeful.tokens_per_s > 1.05 * auto.TRIAL_MARGIN * plan.considered["ar"]
    assert plan.layout == "ar" and planner.request_trials == 0 and not planner.history[-1].trying

    alone = _planner_with(costs)
    _pool_of_good_and_bad(alone)
    assert alone.replan([_active(0)], K_MAX).layout != "ar" and alone.request_trials == 1


def test_a_trial_begun_for_other_requests_is_decided_afresh(clock):
    """A trial started for eight requests must not run on for the sixteen there are just
    after: a change of a quarter of the requests ends it, and no trial starts while a wave of
    requests comes in (it would be judged on their prefill)."""
    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    few = [_active(i, max_draft=1) for i in range(8)]
    planner.replan(few, K_MAX)
    assert planner.explorations == 0                         # no trial as requests come in
    planner.replan(few, K_MAX)
    assert planner.explorations == 1
    begun = planner._exploring
    clock[0] += 0.1
    planner.replan(few, K_MAX)
    assert planner._exploring == begun                       # still trying, same requests
    clock[0] += 0.1
    planner.replan([_active(i, max_draft=1) for i in range(16)], K_MAX)
    assert planner._exploring is None


def test_a_wave_priced_wrong_corrects_prefill_not_decoding(clock, monkeypatch, no_first_trial_of_sd):
    """Decoding on time, one wave of prompts twice its price: the wave's excess goes to the
    prefill slowdown; the decoding slowdown (what every step pays) stays about 1."""
    from gateway import auto

    monkeypatch.setattr(auto, "EXPLORE_WITHIN", 2.0)
    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0, verify_fixed=1e-3,
                      verify_per_token=1e-4, gateway_per_step=2e-4, verify_per_new_token=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    layout = _run_for(planner, clock, requests, 0.2, delivered=1.0, spells=2)[0]     # (enough measured)
    for burst in (0, 0, 5000, 0, 0, 0):
        planner.replan(requests, K_MAX)
        planner.observe_step(layout, round(planner.plan.decode_tokens_per_s * 0.2), burst, _batch(layout, requests))
        clock[0] += 0.2 + 2 * burst * planner.costs().prefill_per_token(layout)
    planner.replan(requests, K_MAX)
    assert planner.slowdown(layout) == pytest.approx(1.0, abs=0.05)
    assert planner.prefill_slowdown(layout) == pytest.approx(2.0, rel=0.1)


def test_a_layout_measured_for_a_moment_is_rechecked_soon_and_judged_afresh(clock, monkeypatch, no_first_trial_of_sd, budget_of_5_percent):
    """A layout measured only briefly (say in the burst of a run's start) is re-checked after
    RECHECK_PER_MEASURED times as long as it ran, not RECHECK_AFTER_S; the re-check's own
    measurement then replaces the old one instead of being averaged with it."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    # (long enough that the trial budget, test_re_checks_take_a_bounded_share_of_the_time, allows one)
    assert set(_run_for(planner, clock, requests, 0.1, delivered=1.0, spells=40)) == {"psd"}
    for _ in range(2):                      # 0.48 s of sd measured, 20% slower than predicted
        planner._measured["sd"].append(_measured_spell(planner, requests, "sd", clock[0], 0.2, 0.24))
    monkeypatch.setattr(auto, "EXPLORE_WITHIN", 0.7)         # sd a contender (0.74 of psd here)
    assert planner.slowdown("sd") == pytest.approx(1.2, rel=0.01)
    wait = auto.RECHECK_PER_MEASURED * 0.48
    assert auto.RECHECK_MIN_S < wait < auto.RECHECK_AFTER_S
    start = clock[0]
    ran = []
    while "sd" not in ran:
        ran = _run_for(planner, clock, requests, 0.1, delivered=1.0)
        assert clock[0] - start < wait + 0.5, "not re-checked soon"
    assert clock[0] - start > wait
    while planner.plan.layout == "sd":      # the trial, delivering as predicted
        _run_for(planner, clock, requests, 0.1, delivered=1.0)
    assert planner.slowdown("sd") == pytest.approx(1.0, abs=0.02)


def _settled_in_psd_the_others_measured_briefly(clock, monkeypatch):
    """A planner running eight requests in psd, sd and ar each measured for a moment, as
    predicted, both contenders; -> (planner, requests)."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    assert set(_run_for(planner, clock, requests, 0.1, delivered=1.0, spells=3)) == {"psd"}
    for layout in ("sd", "ar"):
        planner._measured[layout].append(_measured_spell(planner, requests, layout, clock[0], 0.3, 0.3))
    monkeypatch.setattr(auto, "EXPLORE_WITHIN", 0.5)         # sd 0.74 of psd, ar 0.57 here
    monkeypatch.setattr(auto, "FIRST_EXPLORE_WITHIN", 0.5)
    return planner, requests


def test_re_checks_take_a_bounded_share_of_the_time(clock, monkeypatch, no_first_trial_of_sd):
    """Trials of layouts measured before take at most EXPLORE_SHARE of the running time,
    however often the re-check schedule says one is due (at low concurrency the load swings
    with every wave and resets it): each trial costs two switches and runs a layout likely
    worse. A layout never measured is tried whatever the budget."""
    from gateway import auto

    planner, requests = _settled_in_psd_the_others_measured_briefly(clock, monkeypatch)
    spell_s, spells = 0.1, 400
    for _ in range(spells):
        planner._recheck_after.clear()      # the load swung: every re-check is due at its shortest
        _run_for(planner, clock, requests, spell_s, delivered=1.0)
    trials = sum(1 for d in planner.history if d.trying)
    assert trials, "never re-checked"
    assert trials * spell_s <= auto.EXPLORE_SHARE * spells * spell_s + auto.EXPLORE_MAX_S
    # A layout never measured is tried at once, budget spent or not.
    planner._measured["sd"].clear()
    assert _run_for(planner, clock, requests, spell_s, delivered=1.0) == ["sd"]


def test_a_layouts_first_measurement_does_not_spend_the_trial_budget(clock, budget_of_5_percent):
    """The first trials of the contenders, at the start of a run, measure them below their
    prediction (a trial's draft lengths still move as acceptance is learned): re-checks must
    still come once the budget of re-checks allows, not only after the first trials' time
    has been earned back (with it counted, none came for ten seconds)."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=5e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i, max_draft=1) for i in range(8)]
    spell_s = 0.1
    first = _run_for(planner, clock, requests, spell_s, delivered=0.7, spells=12)
    assert {"sd", "psd"} <= set(first) and planner._trial_s == 0.0          # both measured, for free
    later = _run_for(planner, clock, requests, spell_s, delivered=1.0, spells=120)
    rechecks = sum(1 for d in list(planner.history)[-len(later):] if d.trying)
    assert rechecks, "".join(layout[0] for layout in later)
    assert rechecks * spell_s <= auto.EXPLORE_SHARE * len(later) * spell_s + auto.EXPLORE_MAX_S


def test_the_trial_budget_is_over_recent_running_time(clock):
    """Long running without trials earns no burst of them: the budget counts about the last
    EXPLORE_WINDOW_S of running time."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    for layout in ("sd", "ar"):
        planner._measured[layout].append(_measured_spell(planner, requests, layout, clock[0], 0.3, 0.3))
    _run_for(planner, clock, requests, 1.0, delivered=1.0, spells=round(20 * auto.EXPLORE_WINDOW_S))
    assert planner._running_s < 1.5 * auto.EXPLORE_WINDOW_S
    before = sum(1 for d in planner.history if d.trying)
    spell_s, spells = 0.1, 100
    for _ in range(spells):
        planner._recheck_after.clear()
        _run_for(planner, clock, requests, spell_s, delivered=1.0)
    trials = sum(1 for d in planner.history if d.trying) - before
    assert trials * spell_s <= auto.EXPLORE_SHARE * 1.5 * auto.EXPLORE_WINDOW_S + auto.EXPLORE_MAX_S


def test_the_trial_budget_counts_a_trial_at_the_length_trials_take(clock, monkeypatch, no_first_trial_of_sd):
    """A trial lasts until enough of its layout is measured, and nothing is measured before
    its switch settles: trials whose steps are slow to come back run to EXPLORE_MAX_S. The
    budget counts the next trial at the latest one's length, so re-checks stay within
    EXPLORE_SHARE of the running time (counted at MEASURED_ENOUGH_S, five times as much).
    (Plain decoding's re-checks as the floor reserve nothing, and its trial to measure what
    it delivers is free of the budget: tested apart, and kept out here.)"""
    from gateway import auto

    planner, requests = _settled_in_psd_the_others_measured_briefly(clock, monkeypatch)
    monkeypatch.setattr(auto, "FLOOR_STALE_S", float("inf"))
    monkeypatch.setattr(planner, "_floor_unproven", lambda *args: False)
    spell_s, spells, trial_s = 0.1, 1800, 0.0
    for _ in range(spells):
        planner._recheck_after.clear()      # every re-check is due at its shortest
        plan = planner.replan(requests, K_MAX)
        if planner._exploring is not None and plan.layout == planner._exploring[0]:
            trial_s += spell_s              # none of its steps comes back in time: it never settles
        else:
            for _ in range(STEPS_PER_SPELL):
                planner.observe_step(plan.layout, round(plan.tokens_per_s * planner.slowdown(plan.layout) * spell_s
                                                        / STEPS_PER_SPELL), 0, _batch(plan.layout, requests))
        clock[0] += spell_s
    assert trial_s >= auto.EXPLORE_MAX_S, "never re-checked"
    assert trial_s <= auto.EXPLORE_SHARE * spells * spell_s


def _chooser_of(rates_for):
    """A stand-in for choose_plan: each layout's rate is rates_for(requests running)'s, and
    the best of the layouts allowed is chosen."""
    def choose(costs, wanted, k_cap, layouts=LAYOUTS, **_) -> Plan:
        considered = {layout: rate for layout, rate in rates_for(len(wanted)).items() if layout in layouts}
        layout = max(considered, key=considered.get)
        return Plan(layout, {}, ((),), 0.01, considered[layout], considered, decode_tokens_per_s=considered[layout])
    return choose


@pytest.fixture
def no_trials(monkeypatch):
    """No layout is ever close enough to be tried: the choice alone is tested."""
    from gateway import auto

    monkeypatch.setattr(auto, "EXPLORE_WITHIN", 2.0)
    monkeypatch.setattr(auto, "FIRST_EXPLORE_WITHIN", 2.0)


# sd best for one request, plain decoding for more
_sd_alone_plain_decoding_for_more = _chooser_of(
    lambda n: {"sd": 150.0, "ar": 120.0} if n == 1 else {"ar": 500.0, "sd": 380.0, "psd": 400.0})


def test_a_moment_of_fewer_requests_keeps_the_layout(clock, monkeypatch, no_trials):
    """Plain decoding settled for four requests; at a wave's end one runs alone, and sd is
    best for it. For LOAD_DROP_S the layout stays (the next wave comes within milliseconds);
    a drop that lasts is followed."""
    from gateway import auto

    monkeypatch.setattr(auto, "choose_plan", _sd_alone_plain_decoding_for_more)
    planner = _planner_with(StepCosts(2e-4, 5e-5, 0.0, 1e-3, 1e-4, 2e-4))
    four = [_active(i) for i in range(4)]
    assert planner.replan(four, K_MAX).layout == "ar"
    for wave in range(3):                                   # a few ms of one request, then four again
        clock[0] += 0.2
        assert planner.replan(four[:1], K_MAX).layout == "ar"
        clock[0] += 0.01
        assert planner.replan(four, K_MAX).layout == "ar"
    assert planner.layout_switches == 0
    clock[0] += 0.2
    ran = [planner.replan(four[:1], K_MAX).layout]
    for _ in range(3):
        clock[0] += auto.LOAD_DROP_S / 2
        ran.append(planner.replan(four[:1], K_MAX).layout)
    assert ran == ["ar", "ar", "sd", "sd"]


def test_no_trial_starts_in_a_moment_of_fewer_requests(clock, monkeypatch, one_plan_leads):
    """psd settled for two requests in a closed loop; between a request's end and the next
    one's arrival one runs alone, and for one request plain decoding, never measured, is
    priced within FIRST_EXPLORE_WITHIN of the best (at two it is not). No trial starts in that
    moment (begun there, it ran on at two requests, where plain decoding runs at 0.6 of psd,
    until measured); a drop that lasts past LOAD_DROP_S is a load like any, and trials follow."""
    from gateway import auto

    rates = {1: {"sd": 100.0, "ar": 85.0, "psd": 100.0}, 2: {"psd": 270.0, "sd": 150.0, "ar": 150.0}}
    monkeypatch.setattr(auto, "choose_plan", _chooser_of(lambda n: rates[min(n, 2)]))
    monkeypatch.setattr(auto, "FIRST_EXPLORE_WITHIN", 2.0)          # (settled without trials first)
    planner = _planner_with(StepCosts(2e-4, 5e-5, 0.0, 1e-3, 1e-4, 2e-4))
    two = [_active(0), _active(1)]
    for _ in range(2):
        planner.replan(two, K_MAX)
        clock[0] += 0.2
    assert planner._settled == "psd" and planner._settled_for == 2
    monkeypatch.setattr(auto, "FIRST_EXPLORE_WITHIN", 0.6)
    assert rates[1]["ar"] >= auto.FIRST_EXPLORE_WITHIN * rates[1]["sd"]             # tried for one ...
    assert rates[2]["ar"] < auto.FIRST_EXPLORE_WITHIN * rates[2]["psd"]             # ... not for two
    for turn in range(5):                                   # a few ms of one request, then two again
        assert planner.replan(two[:1], K_MAX).layout == "psd" and not planner.history[-1].trying
        clock[0] += 0.01
        two = [two[0], _active(2 + turn)]
        assert planner.replan(two, K_MAX).layout == "psd" and not planner.history[-1].trying
        clock[0] += 0.2
    assert planner.layout_switches == 1                     # (plain decoding to psd, at the start)
    tried = []
    for _ in range(4):                                      # one request for good
        planner.replan(two[:1], K_MAX)
        tried.append(planner.history[-1].trying)
        clock[0] += auto.LOAD_DROP_S / 2
    assert tried[:2] == ["", ""] and "ar" in tried[2:], tried


def test_the_first_request_after_idling_keeps_the_layout_like_any_drop_in_load(clock, monkeypatch):
    """A closed loop's wave ends (its last request alone for a while, then nothing runs); the
    next wave's first request arrives alone a moment before the rest. It keeps the settled
    layout: the drop's clock starts afresh after idling (run on the last wave's clock, the
    first request was planned sd alone, drafted, and its acceptance started trials)."""
    from gateway import auto

    monkeypatch.setattr(auto, "choose_plan", _sd_alone_plain_decoding_for_more)
    planner = _planner_with(StepCosts(2e-4, 5e-5, 0.0, 1e-3, 1e-4, 2e-4))
    four = [_active(i) for i in range(4)]
    for wave in range(3):
        assert planner.replan(four, K_MAX).layout == "ar"
        clock[0] += 0.2
        assert planner.replan(four[:1], K_MAX).layout == "ar"     # the wave's last request
        clock[0] += auto.LOAD_DROP_S / 2
        planner.idle()
        clock[0] += 1.0                                             # nothing runs for a second
        assert planner.replan(four[:1], K_MAX).layout == "ar"     # the next wave's first
        clock[0] += 0.01
    assert planner.layout_switches == 0


def test_the_next_wave_starts_from_the_layout_settled_for_the_last_waves_body_not_its_tail(
        clock, monkeypatch, no_trials, one_plan_leads):
    """A wave of eight settles on plain decoding; its tail (two requests for a while) settles
    on sd. After idling, the next wave of eight is planned from plain decoding, the body's
    layout: psd, predicted 3% faster now, is no reason to switch (from the tail's sd, the
    eight were another load and psd ran at once); predicted clearly faster, it is chosen."""
    from gateway import auto

    rates = {8: {"ar": 100.0, "psd": 97.0, "sd": 80.0}, 2: {"sd": 100.0, "psd": 85.0, "ar": 80.0}}
    monkeypatch.setattr(auto, "choose_plan", _chooser_of(lambda n: rates[8 if n > 2 else 2]))
    planner = _planner_with(StepCosts(2e-4, 5e-5, 0.0, 1e-3, 1e-4, 2e-4))
    eight = [_active(i) for i in range(8)]
    assert planner.replan(eight, K_MAX).layout == "ar"
    clock[0] += 1.0
    assert planner.replan(eight[:2], K_MAX).layout == "ar"          # the tail: kept for LOAD_DROP_S ...
    clock[0] += 2 * auto.LOAD_DROP_S
    assert planner.replan(eight[:2], K_MAX).layout == "sd"          # ... then followed
    planner.idle()
    clock[0] += 1.0
    rates[8]["psd"] = 103.0
    assert planner.replan(eight[:1], K_MAX).layout == "ar"          # the next wave's first request
    clock[0] += 0.01
    assert planner.replan(eight, K_MAX).layout == "ar"
    clock[0] += 1.0
    rates[8]["psd"] = 120.0
    assert planner.replan(eight, K_MAX).layout == "psd"


def test_a_settled_layout_is_left_only_for_one_leading_it_in_two_plans_in_a_row(clock, monkeypatch, no_trials):
    """psd settled for two requests and running: a plan that prices it past TO_PLAIN_MARGIN
    below plain decoding, followed by one that does not, keeps it (a moment's price: at
    C = 2 psd was left and taken again 20 times in 45 s so); two such plans in a row leave
    it. Coming back to psd, the same."""
    from gateway import auto

    assert auto.LEAD_PLANS == 2
    rates = {"ar": 100.0, "psd": 112.0, "sd": 80.0}
    monkeypatch.setattr(auto, "choose_plan", _chooser_of(lambda n: rates))
    planner = _planner_with(StepCosts(2e-4, 5e-5, 0.0, 1e-3, 1e-4, 2e-4))
    planner._measured["ar"].append(_measured_spell(planner, [_active(9)], "ar", clock[0], 3.0, 3.0))
    two = [_active(i) for i in range(2)]

    def plan(psd: float) -> str:
        rates["psd"] = psd
        clock[0] += 0.2
        return planner.replan(two, K_MAX).layout

    assert [plan(112.0), plan(112.0)] == ["ar", "psd"]
    assert [plan(95.0), plan(112.0), plan(95.0), plan(99.0), plan(95.0)] == ["psd"] * 5
    assert plan(95.0) == "ar"
    two = [_active(i) for i in range(2, 4)]         # (psd is held back while those it was left for run)
    assert [plan(112.0), plan(95.0), plan(112.0)] == ["ar"] * 3
    assert plan(112.0) == "psd"


def test_a_layout_settled_for_another_load_is_not_kept_on_the_margin(clock, monkeypatch):
    """sd settled for the last request of a wave is not kept for the next wave's 64 on the
    switch margin: psd, predicted 5% faster for them, is chosen at once (kept, sd prefilled a
    burst of 64 prompts as one batch). At the load it was chosen for, the margin holds."""
    from gateway import auto

    choose = _chooser_of(lambda n: {"sd": 100.0, "ar": 40.0, "psd": 40.0} if n == 1
                         else {"psd": 100.0, "sd": 95.0, "ar": 50.0})
    monkeypatch.setattr(auto, "choose_plan", choose)
    planner = _planner_with(StepCosts(2e-4, 5e-5, 0.0, 1e-3, 1e-4, 2e-4))
    assert planner.replan([_active(0)], K_MAX).layout == "sd"
    clock[0] += 0.5
    burst = [_active(i) for i in range(64)]
    assert planner.replan(burst, K_MAX).layout == "psd"
    best = choose(None, burst, K_MAX)
    planner._settled, planner._settled_for = "sd", 64
    assert planner._layout_to_keep(best, 48) == "sd"          # the same load: no flapping on 5%
    assert planner._layout_to_keep(best, 16) is None


def test_a_drafting_layout_left_is_not_chosen_again_on_the_models_word_until_measured_or_a_while_later(
        clock, monkeypatch, no_trials, one_plan_leads):
    """psd, predicted 12% ahead, is chosen, then predicted below plain decoding (as once
    measured) and left. Predicted 12% ahead again half a second later, it stays left (at
    C = 2 auto went back and forth so): until HELD_BACK_S have passed, or a re-check
    measured it again; at another load, or once the requests it was left for have all
    finished, it may be chosen at once."""
    from gateway import auto

    rates = {"ar": 100.0, "psd": 112.0, "sd": 80.0}
    monkeypatch.setattr(auto, "choose_plan", _chooser_of(lambda n: rates))
    planner = _planner_with(StepCosts(2e-4, 5e-5, 0.0, 1e-3, 1e-4, 2e-4))
    two = [_active(i) for i in range(2)]

    def leave_psd() -> None:
        rates["psd"] = 112.0
        assert planner.replan(two, K_MAX).layout == "psd"
        clock[0] += 0.2
        rates["psd"] = 95.0
        assert planner.replan(two, K_MAX).layout == "ar"
        clock[0] += 0.5
        rates["psd"] = 112.0
        assert planner.replan(two, K_MAX).layout == "ar"            # held back ...

    leave_psd()
    clock[0] += auto.HELD_BACK_S
    assert planner.replan(two, K_MAX).layout == "psd"              # ... for a while
    leave_psd()
    planner._measured["psd"].append(_measured_spell(planner, two, "psd", clock[0], 0.3, 0.3))
    clock[0] += 0.2
    assert planner.replan(two, K_MAX).layout == "psd"              # ... or until measured again
    leave_psd()
    eight = [_active(i) for i in range(8)]
    assert planner.replan(eight, K_MAX).layout == "psd"            # another load: not held
    for _ in range(2):                  # (fewer than psd was settled for: kept for LOAD_DROP_S)
        clock[0] += auto.LOAD_DROP_S
        planner.replan(two, K_MAX)
    leave_psd()
    one_left = [two[1], _active(9)]
    assert planner.replan(one_left, K_MAX).layout == "ar"          # one it was left for still runs
    others = [_active(10), _active(11)]
    assert planner.replan(others, K_MAX).layout == "psd"           # those it was left for are gone: not held


def test_a_drafting_layout_is_left_for_plain_decoding_on_a_small_margin(clock):
    """psd settled; once plain decoding is predicted 5% faster at the same load it is chosen
    (kept on the 10% switch margin, psd ran at 0.89 of plain decoding for a whole run).
    The other way, and between drafting layouts, the 10% margin holds."""
    from gateway import auto

    def plan_of(rates: dict[str, float]) -> Plan:
        layout = max(rates, key=rates.get)
        return Plan(layout, {}, ((),), 0.01, rates[layout], rates, decode_tokens_per_s=rates[layout])

    planner = _planner_with(StepCosts(2e-4, 5e-5, 0.0, 1e-3, 1e-4, 2e-4))
    planner._settled, planner._settled_for = "psd", 8
    assert planner._layout_to_keep(plan_of({"ar": 105.0, "psd": 100.0, "sd": 80.0}), 8) is None
    assert planner._layout_to_keep(plan_of({"ar": 101.0, "psd": 100.0, "sd": 80.0}), 8) == "psd"
    assert planner._layout_to_keep(plan_of({"sd": 105.0, "psd": 100.0, "ar": 80.0}), 8) == "psd"
    planner._settled = "ar"
    assert planner._layout_to_keep(plan_of({"psd": 105.0, "ar": 100.0, "sd": 80.0}), 8) == "ar"
    assert auto.TO_PLAIN_MARGIN < 1.05 < auto.SWITCH_MARGIN


def _plain_decoding_ahead_of_psd():
    """-> (planner, 8 requests) whose model puts plain decoding ahead of psd."""
    costs = StepCosts(draft_per_forward=1.2e-3, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    first = planner.replan(requests, K_MAX)
    assert first.layout == "ar" and first.considered["psd"] < first.tokens_per_s
    return planner, requests


def test_plain_decoding_kept_out_only_by_its_own_slowdown_is_rechecked_once_due(clock):
    """Plain decoding, the model's best, was measured for seconds at a third of its
    prediction while another process held the cores; auto moved to psd. The model would
    still put it ahead were it no slower than psd, so its measurement alone decides: the
    re-check comes once due even when the latest trial (EXPLORE_MAX_S long, made in that
    slow spell) would not fit in the budget, and finds it back at its prediction. Reserving
    that trial's length first, the re-check waited for 75 s of running (after ten seconds of
    such contention at C = 64, psd ran at about 0.8 of plain decoding for half a minute)."""
    from gateway import auto

    planner, requests = _plain_decoding_ahead_of_psd()
    for _ in range(3):                                      # 9 s of plain decoding, 3x slow
        planner._measured["ar"].append(_measured_spell(planner, requests, "ar", clock[0], 1.0, 3.0))
    slow_until = clock[0]

    run = _spell_runner(planner, clock, requests, {})       # from now on every layout as predicted
    ran = []
    while planner._settled == "ar" and len(ran) < 8:        # (first trials, then a drafting layout:
        ran.append(run(0.5))                                # sd, measured before psd's trial ends)
    assert planner._settled in ("sd", "psd") and planner.slowdown("ar") == pytest.approx(3.0, rel=0.05)
    planner._trial_length_s = auto.EXPLORE_MAX_S            # a trial ran to its limit in the slow spell
    due = auto.RECHECK_AFTER_S
    tried_at = None
    for _ in range(round(2 * due / 0.5)):
        ran.append(run(0.5))
        if tried_at is None and planner.history[-1].trying == "ar":
            tried_at = clock[0] - 0.5
    assert tried_at is not None, "".join(layout[0] for layout in ran)
    assert tried_at - slow_until <= due + 1.0                # when due, not when 1.5 s fit in 2%
    assert ran[-10:] == ["ar"] * 10, "".join(layout[0] for layout in ran)
    assert planner.slowdown("ar") == pytest.approx(1.0, rel=0.05)
    assert sum(1 for d in planner.history if d.trying == "ar") <= 2


def test_plain_decoding_left_on_its_own_slow_reading_is_rechecked_soon_then_ever_later(clock, no_first_trial_of_sd):
    """Plain decoding, the model's best, delivers 0.6 of its prediction for a while and auto
    moves to psd. It would be ahead were it no slower than psd, so the reading alone keeps it
    out: it is re-checked FLOOR_FIRST_RECHECK_S after it was last measured, whatever the trial
    budget, then four times as long after a re-check that finds it still slow, and chosen
    again once it delivers (not after the usual RECHECK_AFTER_S). (Left on the model's word
    alone, predicted behind, it gets no early re-check: see the test of layouts measured slow.)"""
    from gateway import auto

    planner, requests = _plain_decoding_ahead_of_psd()
    for _ in range(3):                                      # 3 s of plain decoding at 0.6 ...
        planner._measured["ar"].append(_measured_spell(planner, requests, "ar", clock[0], 0.6, 1.0))
    planner._trial_s = planner._running_s = 1.0             # ... and the trial budget spent
    measured_at = clock[0]
    slow_until = clock[0] + 10.0                            # slow for ten seconds more

    def run(seconds: float) -> str:
        plan = planner.replan(requests, K_MAX)
        unslowed = plan.tokens_per_s * planner.priced_slowdown(plan.layout)
        delivered = 0.6 if plan.layout == "ar" and clock[0] < slow_until else 1.0
        for _ in range(STEPS_PER_SPELL):
            planner.observe_step(plan.layout, round(unslowed * seconds * delivered / STEPS_PER_SPELL), 0,
                                 _batch(plan.layout, requests))
        clock[0] += seconds
        return plan.layout

    ran = []
    while planner._settled == "ar" and len(ran) < 8:        # (trials of the drafting layouts first)
        ran.append(run(0.25))
    assert "ar" not in ran and planner._settled in ("sd", "psd"), "".join(layout[0] for layout in ran)
    assert planner._recheck_wait("ar") == auto.RECHECK_AFTER_S  # (the usual wait: a long one)
    tried_at, was = [], None
    while clock[0] < slow_until + auto.RECHECK_AFTER_S:
        ran.append(run(0.25))
        trying = planner.history[-1].trying
        if trying == "ar" and was != "ar":
            tried_at.append(clock[0] - 0.25)
        was = trying
        if planner._settled == "ar":
            break
    assert planner._settled == "ar", "".join(layout[0] for layout in ran)
    assert len(tried_at) >= 2 and tried_at[0] - measured_at <= auto.FLOOR_FIRST_RECHECK_S + 1.0, (measured_at, tried_at)
    assert tried_at[1] - tried_at[0] >= 4 * auto.FLOOR_FIRST_RECHECK_S - 1.0, tried_at
    assert clock[0] < slow_until + 6.0                       # back soon after it delivers again
    assert planner._floor_wait is None                      # (none owed while it is settled)


def _plain_decoding_measured_at_start(clock):
    """-> (planner, eight requests) whose model puts plain decoding at 0.65 of psd, with 3 s
    of plain decoding measured as priced, ending now."""
    costs = StepCosts(draft_per_forward=5e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    for _ in range(3):
        planner._measured["ar"].append(_measured_spell(planner, requests, "ar", clock[0], 1.0, 1.0))
    return planner, requests


def test_plain_decoding_priced_behind_is_rechecked_once_unmeasured_for_a_while(clock, no_first_trial_of_sd):
    """Plain decoding priced at 0.65 of psd, too far behind to be a contender, is what auto
    must not lose to, and its price is fitted only while it runs (its lent-core costs fitted
    while another process held the cores priced it at half its speed, and psd ran at 0.86 of
    it for good at C = 8): unmeasured for FLOOR_STALE_S it is re-checked whatever its
    prediction, and chosen where it delivers twice its price."""
    from gateway import auto

    planner, requests = _plain_decoding_measured_at_start(clock)
    measured_at = clock[0]
    first = planner.replan(requests, K_MAX)
    assert first.layout == "psd" and first.considered["ar"] < auto.EXPLORE_WITHIN * first.tokens_per_s

    run = _spell_runner(planner, clock, requests, {"ar": 2.0})
    ran, tried_at = [], None
    for _ in range(round(2 * auto.FLOOR_STALE_S / 0.5)):
        ran.append(run(0.5))
        if tried_at is None and planner.history[-1].trying == "ar":
            tried_at = clock[0] - 0.5
    assert tried_at is not None, "".join(layout[0] for layout in ran)
    assert auto.FLOOR_STALE_S < tried_at - measured_at <= auto.FLOOR_STALE_S + 1.0
    assert ran[-10:] == ["ar"] * 10, "".join(layout[0] for layout in ran)


def test_a_measurement_ages_only_while_requests_run(clock, no_first_trial_of_sd):
    """As above, plain decoding priced behind psd is re-checked once unmeasured for
    FLOOR_STALE_S, but of serving: a server idle in between has learnt nothing new and lost
    nothing. Aged by the clock, every burst after a quiet half-minute began with a re-check
    (the paired bench at C = 4, a setting's runs 3 s in 15: two passes in four). Here the
    server serves 10 s, idles a minute, serves again: the re-check comes FLOOR_STALE_S of
    serving after plain decoding was measured, not at the first plan after the idle minute."""
    from gateway import auto

    planner, requests = _plain_decoding_measured_at_start(clock)
    assert planner.replan(requests, K_MAX).layout == "psd"
    run = _spell_runner(planner, clock, requests, {})
    served, tried_after = 0.0, None
    for _ in range(round(2 * auto.FLOOR_STALE_S / 0.5)):
        if served == 10.0:
            planner.idle()
            clock[0] += 60.0
        run(0.5)
        if planner.history[-1].trying == "ar":
            tried_after = served
            break
        served += 0.5
    assert tried_after is not None
    assert auto.FLOOR_STALE_S <= tried_after <= auto.FLOOR_STALE_S + 1.0


def test_plain_decoding_settled_is_left_only_once_measured_for_a_while(clock, monkeypatch, one_plan_leads):
    """The model puts sd 2.8x ahead of plain decoding for one request; plain decoding, settled
    as at the start, is kept until FLOOR_MEASURED_S of it is measured (it runs meanwhile, so
    that costs nothing but the wait), and then sd is chosen. Read from a moment of it, plain
    decoding's slowdown swung by a third, and psd chosen on such a reading ran for seconds
    at 0.81-0.94 of it. Without the rule sd is settled as soon as its first trial is over."""
    from gateway import auto

    def settled_at(floor_s: float) -> tuple[float, float]:
        """-> (seconds run, plain decoding measured) when sd was first settled."""
        monkeypatch.setattr(auto, "FLOOR_MEASURED_S", floor_s)
        planner, requests = _long_steps_planner()
        run = _spell_runner(planner, clock, requests, {})
        started = clock[0]
        for _ in range(30):
            run(0.5)            # (a step of plain decoding here takes an eighth of a second)
            if planner._settled == "sd":
                return clock[0] - started, planner._measured_s("ar")
        raise AssertionError(f"sd never settled: {[d.layout for d in planner.history]}")

    elapsed, measured = settled_at(FLOOR_MEASURED_S)
    assert measured >= FLOOR_MEASURED_S and elapsed < auto.FLOOR_HOLD_MAX_S
    elapsed_without, measured_without = settled_at(0.0)
    assert measured_without < 1.0 and elapsed_without < elapsed


def test_plain_decoding_never_measured_is_kept_only_so_long(clock, no_trials, monkeypatch):
    """Plain decoding whose spells never count (its steps never verify the batch it was planned
    for) is left for the model's best after FLOOR_HOLD_MAX_S all the same."""
    from gateway import auto

    monkeypatch.setattr(auto, "FLOOR_MEASURED_S", FLOOR_MEASURED_S)

    planner, requests = _long_steps_planner()
    started = clock[0]
    while clock[0] - started < 2 * auto.FLOOR_HOLD_MAX_S and planner._settled == "ar":
        plan = planner.replan(requests, K_MAX)
        for _ in range(STEPS_PER_SPELL):
            planner.observe_step(plan.layout, 1, 0, 4 * len(requests))     # not the planned batch
        clock[0] += 0.25
    assert planner._measured_s("ar") == 0
    assert planner._settled == "sd"
    assert auto.FLOOR_HOLD_MAX_S - 0.5 <= clock[0] - started <= auto.FLOOR_HOLD_MAX_S + 0.5


def test_a_drafting_layout_not_measured_is_priced_at_plain_decodings_slowdown_at_least(clock):
    """Part of what plain decoding's reading holds slows every layout: plain decoding measured
    1.2 slow prices sd and psd, not yet measured, at 1.2 too, not at 1 (at C = 1 sd looked a
    fifth ahead so and was settled on it). A layout's own reading, once there, is its own; none
    is priced below 1 on plain decoding measured faster than its model; and plain decoding, the
    floor, is never priced at a drafting layout's reading."""
    planner, requests = _long_steps_planner()

    def measure(layout: str, slowdown: float) -> None:
        for at in range(12):    # (spells of whole seconds: a step here takes up to a third of one)
            planner._measured[layout].append(
                _measured_spell(planner, requests, layout, clock[0] + at, 1.0, 1.0 * slowdown))

    assert {layout: planner.priced_slowdown(layout) for layout in LAYOUTS} == {"ar": 1.0, "sd": 1.0, "psd": 1.0}
    measure("ar", 1.2)
    assert planner.priced_slowdown("ar") > 1.1
    assert planner.priced_slowdown("sd") == planner.priced_slowdown("psd") == planner.priced_slowdown("ar")
    assert planner.slowdown("sd") == 1.0                      # its own reading: none yet
    measure("sd", 1.05)
    assert 1.0 < planner.priced_slowdown("sd") == planner.slowdown("sd") < planner.priced_slowdown("ar")
    assert planner.priced_slowdown("psd") == planner.priced_slowdown("ar")
    for layout in LAYOUTS:
        planner._measured[layout].clear()
    clock[0] += 100.0           # (later spells: a reading is remembered by its spells' times)
    measure("ar", 0.8)
    assert planner.priced_slowdown("sd") == 1.0
    planner._measured["ar"].clear()
    clock[0] += 100.0
    measure("sd", 1.5)
    assert planner.priced_slowdown("ar") == planner.priced_slowdown("psd") == 1.0 < planner.priced_slowdown("sd")
    # ... and the plan prices them so: psd, a little behind plain decoding on the model, stays
    # behind it when plain decoding's own reading is slow (at 1 it would be 1.3x ahead).
    planner, requests = _plain_decoding_ahead_of_psd()
    clock[0] += 100.0
    for at in range(4):
        planner._measured["ar"].append(_measured_spell(planner, requests, "ar", clock[0] + at, 1.0, 1.3))
    considered = planner.replan(requests, K_MAX).considered
    assert considered["psd"] < considered["ar"]


def _psd_four_percent_ahead_of_plain_decoding(clock, ar_measured_s: float):
    """-> (planner, 8 requests) whose model puts psd 4% ahead of plain decoding (inside
    SWITCH_MARGIN, outside MEASURED_MARGIN), settled in plain decoding for them, and
    `ar_measured_s` of it measured as predicted."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=1e-3, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(8)]
    planner._settled, planner._settled_for = "ar", len(requests)
    measured = _measured_spell(planner, requests, "ar", clock[0], ar_measured_s, ar_measured_s)
    planner._measured["ar"].append(measured)
    planner._delivered["ar"].append(measured)           # (every measured spell is a delivered one)
    rates = choose_plan(costs, planner._wanted(requests, K_MAX), K_MAX).considered
    assert auto.MEASURED_MARGIN < rates["psd"] / rates["ar"] < auto.SWITCH_MARGIN
    return planner, requests


@pytest.mark.parametrize("psd_delivers, chosen", [(1.0, True), (0.97, False)])
def test_a_layout_a_little_ahead_is_measured_on_until_the_smaller_margin_can_judge_it(
        clock, monkeypatch, psd_delivers, chosen):
    """psd predicted 4% ahead of plain decoding, settled: its first trial, while plain
    decoding is measured for less than CONFIRM_S, ends once measured enough and leaves psd
    out on the 10% margin. Re-checked once plain decoding is measured that long, as a close
    contender, whatever the trial budget (none here), the trial runs on until CONFIRM_S of psd
    is measured (it reads within CONFIRM_WITHIN), and the two are then judged on
    MEASURED_MARGIN: psd delivering as predicted (4% ahead) is chosen and kept; delivering 3%
    less (1% ahead), it is not. Nothing of it is charged to the trial budget."""
    from gateway import auto

    monkeypatch.setattr(auto, "EXPLORE_SHARE", 0.0)
    planner, requests = _psd_four_percent_ahead_of_plain_decoding(clock, ar_measured_s=1.0)
    run = _spell_runner(planner, clock, requests, {"psd": psd_delivers})
    spell_s = 0.1
    ran = []
    while planner._measured_s("ar") < auto.CONFIRM_S:
        ran.append(run(spell_s))
        assert len(ran) < 100
    first = "".join(layout[0] for layout in ran)
    assert "p" in first and planner._settled == "ar", first     # its first trial: short
    assert first.count("p") * spell_s < auto.CONFIRM_S / 2, first
    while planner._exploring is None or planner._exploring.layout != "psd":     # the re-check
        ran.append(run(spell_s))
        assert len(ran) < 2000, "never re-checked"
    began = planner._exploring.since
    while planner._exploring is not None:
        ran.append(run(spell_s))
    assert auto.CONFIRM_S <= clock[0] - began <= auto.CONFIRM_MAX_S + spell_s, clock[0] - began
    assert planner._measured_s("psd", since=began) >= auto.CONFIRM_S
    later = [run(spell_s) for _ in range(50)]
    if chosen:
        assert planner._settled == "psd" and later.count("psd") == len(later)
    else:
        assert planner._settled == "ar" and later.count("ar") >= len(later) - 1
    assert planner._trial_s == 0.0


def test_a_recheck_that_reads_its_layout_close_runs_on_uncharged(clock, budget_of_5_percent):
    """psd measured 10% slower than its prediction over a moment (0.95 of plain decoding: a
    contender, not a close one) is re-checked within the trial budget. Delivering as
    predicted (4% ahead) in the re-check, it reads close and runs on until CONFIRM_S of it is
    measured; the budget is charged for the re-check up to then, not for the time it ran on."""
    from gateway import auto

    planner, requests = _psd_four_percent_ahead_of_plain_decoding(clock, ar_measured_s=3.0)
    planner._measured["psd"].append(_measured_spell(planner, requests, "psd", clock[0], 0.5 / 1.1, 0.5))
    run = _spell_runner(planner, clock, requests, {"psd": 1.0})
    spell_s = 0.1
    while planner._exploring is None or planner._exploring.layout != "psd":
        run(spell_s)
        assert clock[0] < 1000.0 + 60.0, "never re-checked"
    assert not planner._exploring.free
    budget_before, began = planner._trial_s, planner._exploring.since
    while planner._exploring is not None and planner._exploring.confirming is None:
        run(spell_s)
    assert planner._exploring is not None, "ended without running on"
    charged_until_confirming = planner._trial_s - budget_before
    while planner._exploring is not None:
        run(spell_s)
    assert clock[0] - began >= auto.CONFIRM_S
    assert 0.0 < planner._trial_s - budget_before <= charged_until_confirming + spell_s


def test_a_close_contender_well_measured_waits_until_its_measurement_ages(clock, monkeypatch):
    """psd measured 1% ahead of plain decoding over CONFIRM_S (within MEASURED_MARGIN: kept
    out), and plain decoding measured as long: a close contender, but its trial would teach
    nothing MEASURED_MARGIN has not judged, so with no trial budget it is not tried again
    while that measurement is within SLOWDOWN_SPAN_S; once it is older, it is tried, free."""
    from gateway import auto

    monkeypatch.setattr(auto, "EXPLORE_SHARE", 0.0)
    planner, requests = _psd_four_percent_ahead_of_plain_decoding(clock, ar_measured_s=3.0)
    measured_s = 2.5
    planner._measured["psd"].append(_measured_spell(planner, requests, "psd", clock[0], 0.97 * measured_s,
                                                    measured_s))
    measured_at = clock[0]
    run = _spell_runner(planner, clock, requests, {"psd": 0.97})
    spell_s = 0.1
    while clock[0] < measured_at + auto.SLOWDOWN_SPAN_S - spell_s:
        assert run(spell_s) != "psd"
    while planner._exploring is None or planner._exploring.layout != "psd":
        run(spell_s)
        assert clock[0] < measured_at + auto.SLOWDOWN_SPAN_S + 1.0, "never re-checked"
    assert planner._exploring.free


def test_a_close_contender_well_measured_is_not_tried_after_an_idle_minute(clock, monkeypatch):
    """As above, with the server idle for a minute 5 s after psd was measured: the
    measurement ages by serving time only (_span_start), so psd, a close contender, is
    tried once SLOWDOWN_SPAN_S of serving has passed, not at the first plan after the idle
    minute (each pass of the paired bench after a quiet half-minute began such a trial)."""
    from gateway import auto

    monkeypatch.setattr(auto, "EXPLORE_SHARE", 0.0)
    planner, requests = _psd_four_percent_ahead_of_plain_decoding(clock, ar_measured_s=3.0)
    measured_s = 2.5
    planner._measured["psd"].append(_measured_spell(planner, requests, "psd", clock[0], 0.97 * measured_s,
                                                    measured_s))
    run = _spell_runner(planner, clock, requests, {"psd": 0.97})
    spell_s, served = 0.1, 0.0
    while served < auto.SLOWDOWN_SPAN_S - 1.0:
        if served == pytest.approx(5.0):
            planner.idle()
            clock[0] += 60.0
        assert run(spell_s) != "psd", served
        served += spell_s
    while planner._exploring is None or planner._exploring.layout != "psd":
        run(spell_s)
        served += spell_s
        assert served < auto.SLOWDOWN_SPAN_S + 1.0, "never re-checked"


def test_a_window_of_serving_time_reaches_back_past_idle_spells(clock):
    """_span_start: the start of the last `span` seconds of serving before a moment, idle
    spells (past ones and the one in progress) left out."""
    from gateway.auto import AutoPlanner

    planner = AutoPlanner(K_MAX)
    now = clock[0]
    planner._idle_spans.extend([(now - 100.0, now - 90.0), (now - 40.0, now - 10.0)])
    assert planner._span_start(now, 5.0) == pytest.approx(now - 5.0)
    assert planner._span_start(now, 20.0) == pytest.approx(now - 50.0)        # 10 s, idle 30, 10 s
    assert planner._span_start(now, 65.0) == pytest.approx(now - 105.0)       # ... 40 s more, idle 10, 5 s
    assert planner._span_start(now - 20.0, 5.0) == pytest.approx(now - 45.0)  # (from inside an idle spell)
    planner._idle_since = now - 3.0                                           # idle now, for 3 s
    assert planner._span_start(now, 5.0) == pytest.approx(now - 8.0)
    assert planner._span_start(now - 5.0, 5.0) == pytest.approx(now - 10.0)   # (before it began)


def test_a_moments_dip_in_load_keeps_the_rechecks_doubled_waits(clock):
    """A re-check's doubled wait (sd's), set at 8 requests, outlasts a moment of another load (the
    first request after idling, a wave's tail): cleared there, each wave of a closed loop
    began with every re-check due at its shortest, and at C = 8 and 16 trials of psd and sd
    came in most passes. A load that stays another for LOAD_MOVED_S of serving clears them."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    planner = _planner_with(costs)
    requests = [_active(i) for i in range(32)]
    planner._recheck_load, planner._recheck_after = 8, {"sd": 8.0}     # (psd is settled)
    planner.replan(requests[:8], K_MAX)
    planner.idle()
    clock[0] += 60.0
    planner.replan(requests[:1], K_MAX)                 # the next wave's first request, alone
    clock[0] += 0.05
    planner.replan(requests[:3], K_MAX)                 # (a wave's tail, then back at 8)
    clock[0] += 0.3
    planner.replan(requests[:8], K_MAX)
    assert planner._recheck_after == {"sd": 8.0} and planner._recheck_load == 8
    for _ in range(round(auto.LOAD_MOVED_S / 0.2) + 1):
        clock[0] += 0.2
        planner.replan(requests, K_MAX)
    assert planner._recheck_after == {} and planner._recheck_load == 32


def test_a_trial_that_reads_its_layout_well_behind_ends_once_measured(clock, budget_of_5_percent):
    """psd delivering 0.85 of its prediction (0.88 of plain decoding, outside CONFIRM_WITHIN):
    its trial ends as soon as it is measured enough, however well plain decoding is measured."""
    from gateway import auto

    planner, requests = _psd_four_percent_ahead_of_plain_decoding(clock, ar_measured_s=3.0)
    run = _spell_runner(planner, clock, requests, {"psd": 0.85})
    ran = [run(0.1) for _ in range(30)]
    assert "psd" in ran and planner._settled == "ar"
    assert ran.count("psd") * 0.1 < auto.CONFIRM_S / 2, ran


def test_trials_for_fresh_requests_that_leave_plain_decoding_come_ever_more_rarely(clock, no_trials, monkeypatch):
    """Each trial of drafting for a fresh request after which plain decoding stays doubles the
    wait before the next (TRIAL_BACKOFF_S), up to its cap; one after which drafting is chosen
    for the request ends the wait. (At C = 1 on the bundled pair a trial began for every
    request, and plain decoding stayed after each.)"""
    from gateway import auto
    from gateway.acceptance_estimate import AcceptanceEstimate

    monkeypatch.setattr(auto, "TRIAL_BACKOFF_S", (0.5, 4.0))   # (within FLOOR_STALE_S: no re-check of
    costs = StepCosts(draft_per_forward=0.01, draft_per_token=0.001, draft_fixed=0.0,   # plain decoding)
                      verify_fixed=0.1, verify_per_token=0.05, gateway_per_step=0.001)
    planner = _planner_with(costs)
    _pool_of_good_and_bad(planner)
    serial = iter(range(1000))

    def arrives() -> tuple[object, bool]:
        """A new request, alone: -> (it, whether a trial of drafting began for it)."""
        request = _active(next(serial))
        trials = planner.request_trials
        plan = planner.replan([request], K_MAX)
        assert (plan.layout != "ar") == (planner.request_trials > trials)
        return request, planner.request_trials > trials

    def trial(request, accepted: int) -> str:
        for _ in range(AcceptanceEstimate.MIN_REQUEST_STEPS):
            clock[0] += 0.05
            planner.acceptance.record(request.seq.stats, K_MAX, accepted)
            planner.observe_step(planner.plan.layout, 1 + accepted, 0, 1, expected=1.0 + accepted)
            planner.replan([request], K_MAX)
        return planner.plan.layout

    least, most = auto.TRIAL_BACKOFF_S
    request, began = arrives()
    assert began and trial(request, accepted=0) == "ar"
    wait = least
    waits = []
    while wait < most:
        clock[0] += 0.9 * wait
        assert not arrives()[1], wait                   # not yet
        clock[0] += 0.2 * wait
        request, began = arrives()
        assert began, wait
        assert trial(request, accepted=0) == "ar"
        waits.append(wait)
        wait = min(most, 2 * wait)
    assert len(waits) == 3 and planner._trial_wait_s == most
    clock[0] += 1.1 * most
    _pool_of_good_and_bad(planner)                      # (as before the bad requests above)
    request, began = arrives()
    assert began and trial(request, accepted=K_MAX) == "sd"      # drafting chosen on its record
    assert planner._trial_wait_s == 0.0                 # the next newcomer's trial: at once


def test_psd_settled_is_kept_through_a_moment_of_one_request(clock, no_trials, one_plan_leads):
    """At C = 2 in a closed loop one request runs alone between a request's end and the next
    one's arrival. psd with one request runs as sd does (one batch empty) and is priced so:
    settled, it is kept through such a moment (LOAD_DROP_S) instead of being left for plain
    decoding at every one; a plan for one request chooses from the other layouts unless psd
    is in force."""
    from gateway import auto

    costs = StepCosts(draft_per_forward=2e-4, draft_per_token=5e-5, draft_fixed=0.0,
                      verify_fixed=1e-3, verify_per_token=1e-4, gateway_per_step=2e-4)
    assert layout_step_s("psd", costs, (3,)) == layout_step_s("sd", costs, (3,))
    planner = _planner_with(costs)
    two = [_active(0), _active(1)]
    plan = planner.replan(two, K_MAX)
    assert plan.layout == "psd" and planner._settled == "psd", plan.considered
    clock[0] += 0.2
    alone = planner.replan(two[:1], K_MAX)                   # the other one has just finished
    assert alone.layout == "psd" and alone.batches == ((two[0].request_id,), ())
    clock[0] += 0.01
    assert planner.replan([two[0], _active(2)], K_MAX).layout == "psd"    # the next one is in
    clock[0] += 0.2
    planner.replan(two[:1], K_MAX)
    clock[0] += auto.LOAD_DROP_S + 0.05
    assert planner.replan(two[:1], K_MAX).layout != "psd"   # one request for good: planned afresh

    fresh = _planner_with(costs)
    for _ in range(20):
        plan = fresh.replan([_active(9)], K_MAX)
        assert "psd" not in plan.considered and plan.layout != "psd"
        clock[0] += 0.2
