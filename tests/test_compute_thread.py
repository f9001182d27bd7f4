"""Each service loads its model on the thread that later runs its steps.

With libgomp, a thread that once ran a parallel region keeps its OpenMP workers for life;
a model loaded with two threads anywhere else left the verifier's forwards sleeping at their
barriers (minedraft.service.placement.compute_thread). These tests follow the start-up of
both services to the point where their servicer exists and compare the threads.
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

import drafter_svc.main as drafter_main
import minedraft.drafter
import minedraft.model_runner
import verifier_svc.main as verifier_main
import verifier_svc.servicer as verifier_servicer


class ServicerBuilt(Exception):
    """Ends a service's start-up once its servicer is made; carries the servicer's arguments."""


def _thread_of(executor) -> int:
    return executor.submit(threading.get_ident).result()


def _capture(*args, **kwargs):
    raise ServicerBuilt(args, kwargs)


def _assert_loaded_on_the_compute_thread(serve, loaded_on: list[int], compute_arg: int) -> None:
    """Run a service's start-up until its servicer is made: the model was loaded once, on
    the thread handed to the servicer as its compute thread (argument `compute_arg`)."""
    with pytest.raises(ServicerBuilt) as built:
        asyncio.run(serve)
    positional, _ = built.value.args
    assert loaded_on == [_thread_of(positional[compute_arg])]
    assert loaded_on[0] != threading.get_ident()


def test_verifier_loads_its_model_on_its_compute_thread(monkeypatch):
    loaded_on = []

    def build(args, rank):
        loaded_on.append(threading.get_ident())
        return SimpleNamespace(device="cpu")

    monkeypatch.setattr(verifier_main, "_build", build)
    monkeypatch.setattr(verifier_servicer, "VerifierServicer", _capture)
    args = verifier_main.parse_args(["--port", "0", "--data-plane", "inband"])
    _assert_loaded_on_the_compute_thread(verifier_main.serve(args), loaded_on, compute_arg=3)


def test_drafter_loads_its_model_on_its_compute_thread(monkeypatch):
    loaded_on = []

    class Runner:
        def __init__(self, config):
            loaded_on.append(threading.get_ident())

    class Pairing:
        data_plane = "inband"

        def __init__(self, *args):
            pass

        async def connect(self):
            return object()

    async def healthy(*args):
        return None

    monkeypatch.setattr(minedraft.model_runner, "ModelRunner", Runner)
    monkeypatch.setattr(minedraft.drafter, "Drafter", lambda runner: runner)
    monkeypatch.setattr(drafter_main, "wait_healthy", healthy)
    monkeypatch.setattr(drafter_main, "Pairing", Pairing)
    monkeypatch.setattr(drafter_main, "DrafterServicer", _capture)
    args = drafter_main.parse_args(["--port", "0", "--verifier", "127.0.0.1:1"])
    _assert_loaded_on_the_compute_thread(drafter_main.serve(args), loaded_on, compute_arg=5)
