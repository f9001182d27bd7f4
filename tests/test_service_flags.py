"""The drafter's and verifier's own commands: every flag explained with its default in --help,
--version, and a KV cache too large for the host refused in one line."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from drafter_svc.main import build_parser as drafter_parser
from minedraft import __version__
from verifier_svc.main import build_parser as verifier_parser

PARSERS = {"drafter_svc": drafter_parser, "verifier_svc": verifier_parser}


@pytest.mark.parametrize("name", PARSERS)
def test_every_flag_is_explained_with_its_default(name, capsys):
    parser = PARSERS[name]()
    for action in parser._actions:
        if action.option_strings and action.help is not argparse.SUPPRESS:
            assert action.help and not action.help.startswith("(default"), f"{name} {action.option_strings[0]}"
    parser.print_help()
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 4096)" in text and "(default: float32)" in text and "--revision REVISION" in text
    assert "Hugging Face Hub id" in text


@pytest.mark.parametrize("name", PARSERS)
def test_version(name, capsys):
    with pytest.raises(SystemExit) as exited:
        PARSERS[name]().parse_args(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"{name} {__version__}"


@pytest.mark.parametrize("name", PARSERS)
def test_a_kv_cache_the_host_cannot_hold_ends_the_service_in_one_line_naming_the_flag(name, tiny_checkpoints):
    """Before the service listens or dials anyone: the model loads, the cache is refused."""
    blocks = 10 ** 12                           # far beyond any host's memory
    done = subprocess.run([sys.executable, "-m", name, "--model", str(tiny_checkpoints["qwen3"]), "--port", "0",
                           "--num-blocks", str(blocks)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert f"out of memory: the KV cache of --num-blocks {blocks} (--block-size 16) needs" in done.stderr
    assert "lower --num-blocks" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("name", PARSERS)
def test_packed_weights_reach_the_runner_and_on_is_refused_where_it_cannot_be(name, tiny_checkpoints):
    from minedraft.service.flags import runner_config

    parser = PARSERS[name]()
    model = str(tiny_checkpoints["qwen3"])
    assert runner_config(parser.parse_args(["--model", model])).packed_weights == "auto"
    assert runner_config(parser.parse_args(["--model", model, "--packed-weights", "off"])).packed_weights == "off"
    refusal = "--packed-weights on: packed weights are for float32 on CPU with oneDNN, not bfloat16 on cpu"
    with pytest.raises(SystemExit, match=refusal):
        runner_config(parser.parse_args(["--model", model, "--packed-weights", "on", "--dtype", "bfloat16"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--packed-weights", "always"])
