"""Checkpoints by Hugging Face id, against a Hub cache built here (the bundled draft model in
the cache's own layout): nothing is ever downloaded. Offline or with the Hub unreachable, a
cached model resolves and loads, and an uncached one fails at once, naming itself.

huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE when it is imported, so each setting is
tried in a fresh interpreter."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minedraft import bundled
from minedraft.model.hub import CheckpointNotFound, resolve_checkpoint, resolve_tokenizer
from minedraft.service.network import free_port

ROOT = Path(__file__).resolve().parents[1]
MODEL = "test-org/tiny-draft"
MAIN, V1 = "a" * 40, "b" * 40          # commits of refs/main and of the tag v1


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """HF_HUB_CACHE holding MODEL at two commits, as `hf download` leaves it."""
    cache = tmp_path_factory.mktemp("hub")
    repo = cache / "models--test-org--tiny-draft"
    for commit in (MAIN, V1):
        shutil.copytree(bundled.DRAFT, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "v1").write_text(V1)
    return cache


def _run(code: str, cache: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    environ.update(HF_HUB_CACHE=str(cache), HF_HOME=str(cache.parent / "hf-home"), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=environ,
                          timeout=120)


RESOLVE = f"""
import json, time
from minedraft.model.hub import CheckpointNotFound, resolve_checkpoint
out = {{"main": str(resolve_checkpoint({MODEL!r})), "v1": str(resolve_checkpoint({MODEL!r}, "v1"))}}
for key, args in (("uncached", ("test-org/not-cached",)), ("no_revision", ({MODEL!r}, "v9"))):
    start = time.monotonic()
    try:
        resolve_checkpoint(*args)
    except CheckpointNotFound as err:
        out[key] = [str(err), time.monotonic() - start]
print(json.dumps(out))
"""


def _resolved(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_offline_a_cached_id_resolves_and_an_uncached_one_fails_at_once(hub_cache):
    out = _resolved(_run(RESOLVE, hub_cache, HF_HUB_OFFLINE="1"))
    repo = hub_cache / "models--test-org--tiny-draft" / "snapshots"
    assert out["main"] == str(repo / MAIN) and out["v1"] == str(repo / V1)
    message, seconds = out["uncached"]
    assert "test-org/not-cached" in message and "HF_HUB_OFFLINE" in message and str(hub_cache) in message
    assert seconds < 2.0
    message, seconds = out["no_revision"]
    assert f"{MODEL} (revision v9)" in message and seconds < 2.0


def test_unreachable_hub_uses_the_cache_and_fails_fast_without_it(hub_cache):
    closed = f"http://127.0.0.1:{free_port()}"          # nothing listens: refused at once
    out = _resolved(_run(RESOLVE, hub_cache, HF_ENDPOINT=closed))
    assert out["main"].endswith(MAIN)
    message, seconds = out["uncached"]
    assert "test-org/not-cached" in message and "cannot be reached" in message and closed in message
    assert seconds < 10.0


def test_a_model_loads_by_id_as_it_does_from_its_directory(hub_cache):
    code = f"""
import torch
from minedraft import bundled
from minedraft.model.loader import load_model
by_id = load_model({MODEL!r}, torch.float32, "cpu", revision="v1").state_dict()
by_dir = load_model(bundled.DRAFT, torch.float32, "cpu").state_dict()
assert by_id.keys() == by_dir.keys() and all(torch.equal(by_id[k], by_dir[k]) for k in by_id)
print("same")
"""
    result = _run(code, hub_cache, HF_HUB_OFFLINE="1")
    assert result.returncode == 0 and result.stdout.strip().endswith("same"), result.stderr


def test_service_mains_take_an_id_and_a_revision(hub_cache):
    code = f"""
from drafter_svc.main import parse_args
from minedraft.service.flags import resolve_model, runner_config
args = parse_args(["--model", {MODEL!r}, "--revision", "v1"])
resolve_model(args, "drafter_svc")
print(args.model, runner_config(args).model_path)
"""
    result = _run(code, hub_cache, HF_HUB_OFFLINE="1")
    assert result.stdout.split() == [MODEL, str(hub_cache / "models--test-org--tiny-draft" / "snapshots" / V1)]
    for service in ("drafter_svc", "verifier_svc"):            # ends before any model loads or port binds
        result = _run(f"from {service}.main import main; main(['--model', 'test-org/not-cached', '--port', '0'])",
                      hub_cache, HF_HUB_OFFLINE="1")
        assert result.returncode == 1
        assert result.stderr.strip() == (f"{service}: error: test-org/not-cached: not a local directory and not in "
                                         f"the Hugging Face cache ({hub_cache}), and HF_HUB_OFFLINE is set: download "
                                         "it where there is network (`hf download test-org/not-cached`) into this "
                                         "cache, or unset HF_HUB_OFFLINE")


def test_directories_are_used_as_they_are_and_bad_paths_never_reach_the_hub(tmp_path):
    assert resolve_checkpoint(bundled.DRAFT) == Path(bundled.DRAFT)
    assert resolve_tokenizer(bundled.TARGET) == Path(bundled.TARGET)
    with pytest.raises(ValueError, match="a revision applies only to a Hugging Face model id"):
        resolve_checkpoint(bundled.DRAFT, "main")
    for bad in (str(tmp_path / "missing"), "./missing", "a/b/c", "~/nowhere"):
        with pytest.raises(CheckpointNotFound, match="no such model directory"):
            resolve_checkpoint(bad)
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointNotFound, match="no such model directory"):
        resolve_checkpoint(tmp_path / "file")
