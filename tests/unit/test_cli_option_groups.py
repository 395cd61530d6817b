"""A command's options in frozen groups (`cli.option_groups`): each field is a flag, in the
groups' order, and the command gets each group built from what was given."""

import dataclasses
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from infinity_cloud.cli.option_groups import with_option_groups


@dataclasses.dataclass(frozen=True)
class Where:
    out: Annotated[str, typer.Option("--out", help="Where it goes.")]
    shards: Annotated[int, typer.Option("--shards", min=1, help="How many.")] = 2


@dataclasses.dataclass(frozen=True)
class What:
    inputs: Annotated[list[str], typer.Argument(help="The files.")]
    loud: Annotated[bool, typer.Option("--loud/--quiet", help="Say more.")] = False


def command_given() -> tuple[typer.Typer, list[tuple[str, Where, What]]]:
    calls: list[tuple[str, Where, What]] = []

    @with_option_groups
    def run(name: Annotated[str, typer.Option("--name")], where: Where, what: What) -> None:
        calls.append((name, where, what))

    app = typer.Typer()
    app.command()(run)
    app.command("other")(lambda: None)  # two commands: `run` keeps its name on the command line
    return app, calls


def test_each_group_is_built_from_its_flags_and_defaults() -> None:
    app, calls = command_given()
    result = CliRunner().invoke(app, ["run", "a.txt", "b.txt", "--out", "o", "--name", "n", "--loud"])
    assert result.exit_code == 0, result.output
    assert calls == [("n", Where(out="o", shards=2), What(inputs=["a.txt", "b.txt"], loud=True))]
    with pytest.raises(dataclasses.FrozenInstanceError):
        calls[0][1].out = "elsewhere"  # type: ignore[misc]


def test_the_groups_fields_are_checked_as_flags_in_their_order() -> None:
    app, _ = command_given()
    refused = CliRunner().invoke(app, ["run", "a.txt", "--out", "o", "--name", "n", "--shards", "0"])
    assert refused.exit_code == 2  # typer's own check of the field's `min`
    missing = CliRunner().invoke(app, ["run", "a.txt", "--name", "n"])
    assert missing.exit_code == 2 and "--out" in missing.output  # a field with no default is required
    shown = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert shown.index("--name") < shown.index("--out") < shown.index("--shards") < shown.index("--loud")


def test_a_flag_in_two_groups_is_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class Again:
        out: Annotated[str, typer.Option("--out")] = "x"

    def run(where: Where, again: Again) -> None: ...

    with pytest.raises(TypeError, match="two option groups"):
        with_option_groups(run)
