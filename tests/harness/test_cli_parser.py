"""cli.py: the parser is the subcommands discovered in rlparity/commands (pkgutil), each with register(sub)."""

from __future__ import annotations

import sys

import pytest

from rlparity import cli, commands


def subcommands() -> list[str]:
    return list(cli.parser()._subparsers._group_actions[0].choices)


def test_every_subcommand_in_its_order():
    assert subcommands() == ["run", "compare", "env", "selftest", "golden", "images", "report"]


def test_a_module_dropped_into_commands_is_a_subcommand(tmp_path, monkeypatch):
    """The report engineer's commands/report.py replaces the rlparity.report fallback, with nothing else to edit."""
    (tmp_path / "report.py").write_text(
        "def register(sub):\n    sub.add_parser('report', help='from commands/').set_defaults(func=lambda a: 0)\n"
    )
    (tmp_path / "zzz.py").write_text("def register(sub):\n    sub.add_parser('zzz').set_defaults(func=lambda a: 7)\n")
    monkeypatch.setattr(commands, "__path__", [*commands.__path__, str(tmp_path)])
    try:
        modules = cli.command_modules()
        assert [m.__name__ for m in modules][-2:] == ["rlparity.commands.report", "rlparity.commands.zzz"]
        assert "rlparity.report" not in [m.__name__ for m in modules]
        assert cli.main(["zzz"]) == 7
    finally:  # the two modules must not outlive this test
        for name in ("rlparity.commands.report", "rlparity.commands.zzz"):
            sys.modules.pop(name, None)


@pytest.mark.parametrize("argv", [["nope"], ["run", "--jobs", "x"], []])
def test_bad_arguments_are_bad_configuration(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.parser().parse_args(argv)
    assert info.value.code == 3
