"""Option help that lists registered names, filled when the help is shown, not when the command line is
imported: listing a kind loads the plugins (``latentsift._core.registry``), and ``latentsift --help`` or a
command that lists nothing should import none of them."""
from __future__ import annotations

import re
from typing import Callable, Iterable

import typer
from typer.cli import get_docs_for_click
from typer.core import TyperCommand, TyperGroup

_FIELD = re.compile(r"\{(\w+)\}")


def listed(**names: Callable[[], Iterable[str]]) -> type[TyperCommand]:
    """The command class (``app.command(name, cls=listed(filters=method_names))``) whose option and argument help
    has each ``{field}`` replaced by ``", ".join(names[field]())`` when its help is shown."""

    class Listed(TyperCommand):
        def fill_help(self) -> None:
            """Each ``{field}`` of the options' help -> the registered names, as ``--help`` shows them."""
            fields = {field: ", ".join(get()) for field, get in names.items()}
            for p in self.params:
                template = p.__dict__.setdefault("_help_template", getattr(p, "help", None))
                if template:
                    p.help = _FIELD.sub(lambda m: fields.get(m[1], m[0]), template)

        def format_help(self, ctx: typer.Context, formatter) -> None:
            self.fill_help()
            super().format_help(ctx, formatter)

    return Listed


def markdown_reference(root: TyperGroup, commands: Iterable[str], prog: str) -> str:
    """The named commands' reference in Markdown (docs/cli.md), each called as ``prog COMMAND``: typer's own
    generator (what ``typer MODULE utils docs`` writes) per command, its subcommands included, each option's help
    with its registered names filled in as ``--help`` shows them."""
    def fill(cmd: TyperCommand | TyperGroup) -> None:
        getattr(cmd, "fill_help", lambda: None)()
        for sub in getattr(cmd, "commands", {}).values():
            fill(sub)

    out = []
    for name in commands:
        cmd = root.commands[name]
        fill(cmd)
        out.append(get_docs_for_click(obj=cmd, ctx=typer.Context(cmd), name=name, call_prefix=prog, indent=1).strip())
    return "\n\n".join(out) + "\n"
