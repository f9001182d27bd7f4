"""argparse help that shows every flag's default where it has one worth showing, for the
`minedraft` command, its subcommands and the services' own commands."""

from __future__ import annotations

import argparse
from typing import Any


def _worth_showing(default: Any) -> bool:
    """Not an off switch, an empty string or None."""
    return not (default is None or default is False or default == "" or default == [] or default is argparse.SUPPRESS)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" unless the help already speaks of the default, or there is none
    worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        if not _worth_showing(action.default) or "default" in help.lower():
            return help
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser using DefaultsHelpFormatter; its subcommands' parsers inherit it. A
    flag added without help still shows its default (argparse prints nothing for it else)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.help is None and action.option_strings and _worth_showing(action.default):
            action.help = "(default: %(default)s)"
        return action
