"""cli.py: the parser is the subcommands discovered in rlparity/commands (pkgutil), each with register(sub)."""

from __future__ import annotations

import sys

import pytest

from rlparity import cli, commands


def subcommands() -> list[str]:
    return list(cli.parser()._subparsers._group_actions[0].choices)


def test_every_subcommand_in_its_order():
    assert subcommands() == ["run", "compare", "env", "selftest", "golden", "images", "report", "locate"]


def test_a_module_dropped_into_commands_is_a_subcommand(tmp_path, monkeypatch):
    """A new subcommand is one module in rlparity/commands with register(sub): nothing else to edit."""
    (tmp_path / "zzz.py").write_text("def register(sub):\n    sub.add_parser('zzz').set_defaults(func=lambda a: 7)\n")
    monkeypatch.setattr(commands, "__path__", [*commands.__path__, str(tmp_path)])
    try:
        modules = cli.command_modules()
        assert [m.__name__ for m in modules][-1] == "rlparity.commands.zzz"
        assert cli.main(["zzz"]) == 7
    finally:  # the module must not outlive this test
        sys.modules.pop("rlparity.commands.zzz", None)


@pytest.mark.parametrize("argv", [["nope"], ["run", "--jobs", "x"], []])
def test_bad_arguments_are_bad_configuration(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.parser().parse_args(argv)
    assert info.value.code == 3
