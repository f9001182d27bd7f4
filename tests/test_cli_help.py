"""`minedraft --version`, and `--help` of every command explaining every flag with its default
(the services' own commands too: the gateway's)."""

from __future__ import annotations

import argparse

import pytest

from gateway.main import ANY_PORT, parse_args
from minedraft import __version__
from minedraft.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser, name: str = "minedraft"):
    """(name, parser) of the command and of every subcommand under it."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _commands(sub, f"{name} {sub_name}")


def test_version(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"minedraft {__version__}"


def test_every_flag_of_every_subcommand_is_explained():
    commands = dict(_commands(build_parser()))
    assert {"minedraft serve", "minedraft generate", "minedraft demo", "minedraft drafters list"} <= set(commands)
    for name, parser in commands.items():
        for action in parser._actions:
            if action.option_strings and action.help is not argparse.SUPPRESS:
                assert action.help, f"{name} {action.option_strings[0]} has no help"


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    serve_help = " ".join(capsys.readouterr().out.split())
    assert "(0: off); see docs/http.md (default: 8000)" in serve_help
    assert "(default: 4096)" in serve_help
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    gateway_help = " ".join(capsys.readouterr().out.split())
    assert "--http-port HTTP_PORT serve the OpenAI-compatible HTTP API" in gateway_help
    assert "(default: 1024)" in gateway_help


def test_gateway_http_port_is_a_port_off_or_any(capsys):
    assert parse_args(["--http-port", "any"]).http_port == ANY_PORT
    assert parse_args(["--http-port", "8001"]).http_port == 8001
    assert parse_args([]).http_port == 0
    for bad in ("-1", "65536", "eight"):
        with pytest.raises(SystemExit):
            parse_args(["--http-port", bad])
        assert f"--http-port: invalid http_port value: '{bad}'" in capsys.readouterr().err
