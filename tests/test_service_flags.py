"""The drafter's and verifier's own commands: every flag explained with its default in --help,
and --version."""

from __future__ import annotations

import argparse

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
