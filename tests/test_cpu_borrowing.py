"""Each service computing on the other's cores while the other waits (auto mode's plain
decoding and sequential SD on CPU): the switch moves every thread of the process and torch's
thread count, and back; the verifier and the drafter say which steps computed on the lent
cores; the launcher lends them in auto mode only."""

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
    return _serve(servicer, [engine_pb2.VerifyStepRequest(step_id=step_id, new_requests=[new] if step_id == 1 else [],
                                                          items=[engine_pb2.VerifyItem(request_id="r")],
                                                          borrow_cpus=flag)
                             for step_id, flag in enumerate(borrow, start=1)])


def _serve(servicer, requests: list) -> list:
    """Each request through the servicer's Step in turn; -> (response, this process's thread
    masks after it) per request."""
    async def scenario():
        return [(await servicer.Step(request, None), _masks()) for request in requests]

    try:
        return asyncio.run(scenario())
    finally:
        for pool in (servicer.compute, getattr(servicer, "sending", None)):
            if pool is not None:
                pool.shutdown()


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


# ---- the drafter ------------------------------------------------------------------------

def _draft_steps(tiny_checkpoints, flags: list[str], steps: list[tuple[bool, bool]]):
    """Draft steps of one request through a drafter built from `flags` as `drafter_svc`
    builds it, one per (borrow_cpus, drafts something) in `steps` (a step that drafts
    nothing only frees); -> (response, this process's thread masks after it) per step."""
    from drafter_svc.main import parse_args
    from drafter_svc.servicer import DrafterServicer
    from minedraft.data_plane import InBandDraftSender
    from minedraft.drafter import Drafter
    from minedraft.model_runner import ModelRunner
    from minedraft.service.cpu_lending import core_lender
    from minedraft.service.flags import runner_config
    from minedraft.service.placement import place_process

    args = parse_args(["--model", str(tiny_checkpoints["qwen3"]), "--num-blocks", "64", "--block-size", "4",
                       "--threads", "1", *flags])
    lender = core_lender(args.borrow_cpus, args.cpus, args.threads, args.device, service="this drafter")
    place_process(args.cpus)
    sent = []
    servicer = DrafterServicer(Drafter(ModelRunner(runner_config(args))), InBandDraftSender(sent.append),
                               "inband", "tiny", "d0", lender)
    new = engine_pb2.NewRequest(request_id="r", token_ids=[3, 4, 5],
                                sampling=generation_pb2.SamplingOptions(max_tokens=64))

    return _serve(servicer, [engine_pb2.DraftStepRequest(
        step_id=step_id, new_requests=[new] if step_id == 1 else [], borrow_cpus=borrow,
        items=[engine_pb2.DraftItem(request_id="r", num_draft=2)] if drafts else [])
        for step_id, (borrow, drafts) in enumerate(steps, start=1)])


@needs_two_cores
def test_the_drafter_says_which_steps_drafted_on_the_lent_cores(tiny_checkpoints, restore_placement):
    """A drafting step asks; one that only frees leaves the threads where they are."""
    own, lent = str(ALLOWED[1]), str(ALLOWED[0])
    answers = _draft_steps(tiny_checkpoints, ["--cpus", own, "--borrow-cpus", lent],
                           [(True, True), (False, False), (True, True), (False, True), (True, False)])
    both, alone = {frozenset(ALLOWED[:2])}, {frozenset(ALLOWED[1:2])}
    assert [response.borrowed for response, _ in answers] == [True, True, True, False, False]
    assert [masks for _, masks in answers] == [both, both, both, alone, alone]
    assert answers[0][0].busy_s > 0 and answers[2][0].busy_s > 0


@needs_two_cores
def test_a_drafter_with_nothing_to_borrow_never_says_borrowed(tiny_checkpoints, restore_placement):
    answers = _draft_steps(tiny_checkpoints, ["--cpus", str(ALLOWED[1])], [(True, True), (False, True)])
    assert [response.borrowed for response, _ in answers] == [False, False]
    assert answers[0][1] == answers[1][1] == {frozenset(ALLOWED[1:2])}


def test_bad_drafter_borrow_cpus_are_refused():
    from drafter_svc.main import parse_args

    for spec in ("x", f"{max(ALLOWED, default=0) + 1000}"):
        with pytest.raises(SystemExit):
            parse_args(["--borrow-cpus", spec])


@needs_two_cores
def test_borrowing_is_off_with_tensor_parallel_ranks_a_gpu_or_no_cores_of_others(caplog):
    from verifier_svc.main import core_lender, parse_args

    own, lent = str(ALLOWED[0]), str(ALLOWED[1])
    assert core_lender(parse_args(["--cpus", own]), own) is None
    assert core_lender(parse_args(["--cpus", own, "--borrow-cpus", lent]), own) is not None
    with caplog.at_level(logging.WARNING, logger="minedraft.service"):
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
    assert args[args.index("--data-plane") + 1] == ("inband" if config.mode == "ar" else "gloo")


@pytest.mark.parametrize("changes, lent", [
    ({}, "0"), ({"target_cpus": "0,2"}, "0,2"), ({"tp": 2, "target_cpus": "0,2"}, "0,2"), ({"mode": "psd"}, ""),
    ({"mode": "sd"}, ""), ({"draft_device": "cuda"}, ""), ({"target_cpus": "0-1"}, ""), ({"target_cpus": ""}, ""),
    ({"draft_cpus": ""}, "")])
def test_the_launcher_lends_the_verifiers_cores_to_the_drafters_in_auto_mode_only(changes, lent):
    config = ServeConfig(**{"mode": "auto", "port": 0, "target_cpus": "0", "draft_cpus": "1", **changes})
    assert config.draft_lent_cpus == lent
    cluster = Cluster(config)
    cluster.verifier_address, cluster.admin_address = "127.0.0.1:1", "127.0.0.1:2"
    spawned = []
    cluster._spawn = lambda name, args: spawned.append(args)
    cluster._spawn_drafter()
    args, = spawned
    assert (args[args.index("--borrow-cpus") + 1] if "--borrow-cpus" in args else "") == lent


@needs_two_cores
def test_the_verifier_takes_the_launchers_arguments():
    from verifier_svc.main import parse_args

    config = ServeConfig(mode="auto", port=0, target_cpus=str(ALLOWED[0]), draft_cpus=str(ALLOWED[1]))
    args = parse_args(Cluster(config).verifier_args(port=0)[1:])
    assert (args.cpus, args.borrow_cpus) == (str(ALLOWED[0]), str(ALLOWED[1]))
