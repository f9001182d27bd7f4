"""The verifier as two tensor-parallel ranks (gloo) behind the real services: greedy output of
every mode equals TP = 1's, and `minedraft serve --tp 2 --drafters 2` answers a stream."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from types import SimpleNamespace

import grpc
import pytest

from cluster_helpers import MAX_TOKENS, assert_idle, generate_all, request, stub
from minedraft import bundled
from minedraft.launcher import Cluster, ServeConfig
from minedraft.v1 import engine_pb2, engine_pb2_grpc, generation_pb2
from reference import DRAFT, TARGET, assert_matches_reference, greedy_reference


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return bundled.load_prompts(16)


@pytest.fixture(scope="module")
def reference(prompts):
    return greedy_reference(prompts, MAX_TOKENS)


@pytest.mark.parametrize("mode,k", [("ar", 0), ("sd", 3), ("psd", 3)])
def test_tp2_greedy_equals_tp1(prompts, reference, mode, k):
    llm, expected = reference
    config = ServeConfig(mode=mode, k=k, max_batch=4 if mode == "psd" else 8, port=0, target=TARGET, draft=DRAFT,
                         num_blocks=512, tp=2, target_cpus="", draft_cpus="")
    with Cluster(config) as cluster:
        info = engine_pb2_grpc.VerifierStub(grpc.insecure_channel(cluster.verifier_address)).GetInfo(
            engine_pb2.EngineInfoRequest(), timeout=10)
        assert info.tp_size == 2
        responses = generate_all(cluster, [request(p) for p in prompts])
        assert all(len(r.token_ids) == MAX_TOKENS for r in responses), [len(r.token_ids) for r in responses]
        # TP sums partial products in another order: only a near-tie may flip a token.
        assert_matches_reference(llm, prompts, expected, [list(r.token_ids) for r in responses], f"tp2 {mode}")
        if mode != "ar":
            assert sum(r.stats.num_accepted for r in responses) > 0
        assert_idle(cluster)
        seeded = [request(p, temperature=1.0, seed=7 + i, max_tokens=12) for i, p in enumerate(prompts[:4])]
        first = [list(r.token_ids) for r in generate_all(cluster, seeded)]
        assert first == [list(r.token_ids) for r in generate_all(cluster, seeded, concurrency=2)]


def test_serve_cli_tp2_two_drafters_streams():
    proc = subprocess.Popen([sys.executable, "-m", "minedraft.cli", "serve", "--tp", "2", "--drafters", "2",
                             "--port", "0", "--num-blocks", "256", "--target-cpus", "", "--draft-cpus", ""],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    watchdog = threading.Timer(300, proc.kill)     # never wait for ever on a serve that says nothing
    watchdog.start()
    try:
        for line in proc.stdout:                    # "... serving on HOST:PORT (pool admin on ...); ..."
            lines.append(line)
            found = re.search(r"serving on (\S+) \(pool admin on (\S+)\);", line)
            if found:
                address = found.group(1)
                break
        else:
            pytest.fail("serve exited before serving:\n" + "".join(lines))
        gateway = stub(SimpleNamespace(address=address))
        chunks = list(gateway.GenerateStream(request(bundled.load_prompts(1)[0], max_tokens=12), timeout=120))
        assert sum(len(c.token_ids) for c in chunks) == 12 and chunks[-1].finish_reason == "length"
        info = gateway.GetServerInfo(generation_pb2.ServerInfoRequest(), timeout=10)
        assert info.num_drafters == 2 and info.mode == "auto"     # serve's default
    finally:
        watchdog.cancel()
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, "".join(lines) + output
    assert "all services stopped" in output


def test_local_followers_are_given_the_port_of_a_store_socket_already_bound(monkeypatch):
    """Without --tp-address the verifier binds rank 0's store socket before it starts the
    other ranks, and gives them its port: nothing else can take the port in between. Given
    an address, it binds nothing ahead (rank 0's store binds it when built)."""
    import verifier_svc.main as verifier_main

    started = []
    monkeypatch.setattr(verifier_main.subprocess, "Popen", lambda cmd: started.append(cmd) or cmd)
    args = verifier_main.parse_args(["--tp", "3"])
    assert args.tp_listener is None and not args.tp_address
    assert len(verifier_main._spawn_followers(args, ["--tp", "3"])) == 2
    try:
        port = args.tp_listener.getsockname()[1]
        assert args.tp_address == f"127.0.0.1:{port}"
        for rank, cmd in enumerate(started, start=1):
            assert cmd[cmd.index("--tp-address") + 1] == args.tp_address
            assert cmd[cmd.index("--tp-rank") + 1] == str(rank)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass                                            # listening already: a follower's dial waits
    finally:
        args.tp_listener.close()
    given = verifier_main.parse_args(["--tp", "2", "--tp-address", "127.0.0.1:29511"])
    verifier_main._spawn_followers(given, ["--tp", "2", "--tp-address", "127.0.0.1:29511"])
    assert given.tp_listener is None and started[-1][started[-1].index("--tp-address") + 1] == "127.0.0.1:29511"


def test_verifier_rank_flags_and_torchrun_environment(monkeypatch):
    from verifier_svc.main import parse_args, rank_cpus, rank_device

    args = parse_args(["--tp", "4", "--tp-rank", "2", "--tp-address", "10.0.0.1:29500"])
    assert (args.tp, args.tp_rank, args.tp_address) == (4, 2, "10.0.0.1:29500")
    with pytest.raises(SystemExit):
        parse_args(["--tp", "2", "--tp-rank", "1"])              # a lone rank must know the store
    with pytest.raises(SystemExit):
        parse_args(["--tp", "2", "--tp-rank", "2", "--tp-address", "h:1"])
    for key, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "MASTER_ADDR": "node0",
                       "MASTER_PORT": "29400"}.items():
        monkeypatch.setenv(key, value)
    args = parse_args([])
    assert (args.tp, args.tp_rank, args.tp_address) == (4, 3, "node0:29400")
    assert rank_device("cuda", 3, 4) == ("cuda:3", "nccl")       # one GPU per rank: NCCL
    assert rank_device("cuda:0", 3, 4) == ("cuda:0", "gloo")     # ranks share a GPU: staged gloo
    assert rank_device("cpu", 1, 2) == ("cpu", "gloo")
    assert rank_cpus("0-3", 1, 2) == "2,3" and rank_cpus("0", 1, 2) == "0"
