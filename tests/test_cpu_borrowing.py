"""The verifier computing on the drafter's cores while nothing drafts (auto mode's plain
decoding): the switch moves every thread of the process and torch's thread count, and back;
the verifier says which steps computed on the lent cores; the launcher lends them in auto
mode only."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from minedraft.launcher import Cluster, ServeConfig
from minedraft.v1 import engine_pb2, generation_pb2

ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_two_cores = pytest.mark.skipif(len(ALLOWED) < 2 or not hasattr(os, "sched_setaffinity"),
                                     reason="needs two cores and sched_setaffinity")


def _masks() -> set[frozenset[int]]:
    """The distinct core sets of this process's threads."""
    return {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")}


@pytest.fixture
def restore_placement():
    """The switch moves every thread of this test process: put them all back afterwards."""
    from minedraft.service.placement import pin_all_threads

    threads = torch.get_num_threads()
    yield
    pin_all_threads(set(ALLOWED))
    torch.set_num_threads(threads)


@needs_two_cores
def test_the_switch_moves_every_thread_and_torchs_thread_count_and_back(restore_placement):
    from minedraft.service.cpu_lending import CoreLender

    own, lent = {ALLOWED[0]}, {ALLOWED[1]}
    lender = CoreLender(own, 1, lent)
    stop = threading.Event()
    bystander = threading.Thread(target=stop.wait)      # a thread that never computes (gRPC's, say)
    bystander.start()
    a = torch.randn(256, 256)

    def switch(borrow: bool) -> tuple[bool, int, set[frozenset[int]]]:
        in_use = lender.use(borrow)
        torch.mm(a, a)                  # with two threads, OpenMP's worker starts here: under which mask?
        return in_use, torch.get_num_threads(), _masks()

    try:
        with ThreadPoolExecutor(max_workers=1) as compute:
            assert compute.submit(switch, False).result()[2] == {frozenset(ALLOWED)}   # no change: no-op
            assert compute.submit(switch, True).result() == (True, 2, {frozenset(own | lent)})
            assert compute.submit(switch, True).result()[:2] == (True, 2)
            assert compute.submit(switch, False).result() == (False, 1, {frozenset(own)})
    finally:
        stop.set()
        bystander.join()


@needs_two_cores
def test_placing_a_service_moves_every_thread_not_only_the_caller(restore_placement):
    """The verifier places itself from a worker thread; its compute thread starts elsewhere."""
    from minedraft.service.placement import place_process

    stop = threading.Event()
    bystander = threading.Thread(target=stop.wait)
    bystander.start()
    try:
        with ThreadPoolExecutor(max_workers=1) as worker:
            worker.submit(place_process, str(ALLOWED[1])).result()
        assert _masks() == {frozenset(ALLOWED[1:2])}
    finally:
        stop.set()
        bystander.join()


def test_lent_cores_must_be_others_than_the_own():
    from minedraft.service.cpu_lending import CoreLender

    for own, lent in (({0}, {0, 1}), ({0}, set()), (set(), {1})):
        with pytest.raises(ValueError, match="disjoint"):
            CoreLender(own, 1, lent)


# ---- the verifier -----------------------------------------------------------------------

@pytest.fixture
def build_verifier(tiny_checkpoints, restore_placement):
    """-> build(*flags): the verifier's step executor as `verifier_svc` builds it."""
    from verifier_svc.main import _build, parse_args

    def build(*flags: str):
        args = parse_args(["--model", str(tiny_checkpoints["qwen3"]), "--num-blocks", "64", "--block-size", "4",
                           "--threads", "1", *flags])
        with ThreadPoolExecutor(max_workers=1) as pool:     # serve() builds off the event loop's thread too
            return pool.submit(_build, args, 0).result()

    return build


def _plain_steps(executor, borrow: list[bool]) -> list[engine_pb2.VerifyStepResponse]:
    """Plain decoding steps of one request through the servicer (on its compute thread), one
    per entry of `borrow`; -> the responses, with this process's thread masks after each."""
    from verifier_svc.servicer import VerifierServicer

    servicer = VerifierServicer(executor, pairings=None, model_name="tiny")
    new = engine_pb2.NewRequest(request_id="r", token_ids=[3, 4, 5],
                                sampling=generation_pb2.SamplingOptions(max_tokens=8))

    async def scenario() -> list[tuple[engine_pb2.VerifyStepResponse, set[frozenset[int]]]]:
        answers = []
        for step_id, flag in enumerate(borrow, start=1):
            request = engine_pb2.VerifyStepRequest(step_id=step_id, new_requests=[new] if step_id == 1 else [],
                                                   items=[engine_pb2.VerifyItem(request_id="r")], borrow_cpus=flag)
            answers.append((await servicer.Step(request, None), _masks()))
        return answers

    try:
        return asyncio.run(scenario())
    finally:
        servicer.compute.shutdown()


@needs_two_cores
def test_the_verifier_says_which_steps_computed_on_the_lent_cores(build_verifier):
    own, lent = str(ALLOWED[0]), str(ALLOWED[1])
    answers = _plain_steps(build_verifier("--cpus", own, "--borrow-cpus", lent), [True, True, False, True])
    assert [response.borrowed for response, _ in answers] == [True, True, False, True]
    assert [masks for _, masks in answers] == [{frozenset(ALLOWED[:2])}] * 2 + [{frozenset(ALLOWED[:1])}] + [
        {frozenset(ALLOWED[:2])}]
    assert all(len(response.results[0].token_ids) == 1 and response.busy_s > 0 for response, _ in answers)


@needs_two_cores
def test_a_verifier_with_nothing_to_borrow_never_says_borrowed(build_verifier):
    answers = _plain_steps(build_verifier("--cpus", str(ALLOWED[0])), [True, False])
    assert [response.borrowed for response, _ in answers] == [False, False]
    assert answers[0][1] == answers[1][1]           # no thread moved


@needs_two_cores
def test_borrowing_is_off_with_tensor_parallel_ranks_a_gpu_or_no_cores_of_others(caplog):
    from verifier_svc.main import core_lender, parse_args

    own, lent = str(ALLOWED[0]), str(ALLOWED[1])
    assert core_lender(parse_args(["--cpus", own]), own) is None
    assert core_lender(parse_args(["--cpus", own, "--borrow-cpus", lent]), own) is not None
    with caplog.at_level(logging.WARNING, logger="minedraft.verifier"):
        for flags in (["--tp", "2"], ["--device", "cuda"], ["--borrow-cpus", own]):
            args = parse_args(["--cpus", own, "--borrow-cpus", lent, *flags])
            assert core_lender(args, own) is None
    assert [r.getMessage().split("borrowing is off, ")[1] for r in caplog.records] == [
        "tensor-parallel ranks run in lockstep", "the device is cuda, not cpu",
        "they are this verifier's own cores already (--cpus)"]


def test_bad_borrow_cpus_are_refused():
    from verifier_svc.main import parse_args

    for spec in ("x", f"{max(ALLOWED, default=0) + 1000}"):
        with pytest.raises(SystemExit):
            parse_args(["--borrow-cpus", spec])


# ---- the launcher -----------------------------------------------------------------------

def test_serve_defaults_to_auto_mode_with_sixteen_requests_at_once():
    config = ServeConfig()
    assert (config.mode, config.max_batch) == ("auto", 16)
    with pytest.raises(ValueError, match="draft_cpus"):
        ServeConfig(draft_cpus="one")


@pytest.mark.parametrize("changes, lent", [
    ({}, "1"), ({"draft_cpus": "2-3"}, "2-3"), ({"mode": "psd"}, ""), ({"mode": "sd"}, ""), ({"mode": "ar"}, ""),
    ({"tp": 2}, ""), ({"target_device": "cuda"}, ""), ({"draft_cpus": "0-1"}, ""), ({"draft_cpus": ""}, ""),
    ({"target_cpus": ""}, "")])
def test_the_launcher_lends_the_drafters_cores_in_auto_mode_only(changes, lent):
    config = ServeConfig(**{"mode": "auto", "port": 0, "target_cpus": "0", "draft_cpus": "1", **changes})
    args = Cluster(config).verifier_args(port=0)
    assert (args[args.index("--borrow-cpus") + 1] if "--borrow-cpus" in args else "") == lent
    assert args[args.index("--data-plane") + 1] == ("inband" if config.mode == "ar" else "unix")


@needs_two_cores
def test_the_verifier_takes_the_launchers_arguments():
    from verifier_svc.main import parse_args

    config = ServeConfig(mode="auto", port=0, target_cpus=str(ALLOWED[0]), draft_cpus=str(ALLOWED[1]))
    args = parse_args(Cluster(config).verifier_args(port=0)[1:])
    assert (args.cpus, args.borrow_cpus) == (str(ALLOWED[0]), str(ALLOWED[1]))
