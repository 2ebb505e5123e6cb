"""Option help that lists registered names, filled when the help is shown, not when the command line is
imported: listing a kind loads the plugins (``latentsift._core.registry``), and ``latentsift --help`` or a
command that lists nothing should import none of them."""
from __future__ import annotations

import re
from typing import Callable, Iterable

import typer
from typer.core import TyperCommand

_FIELD = re.compile(r"\{(\w+)\}")


def listed(**names: Callable[[], Iterable[str]]) -> type[TyperCommand]:
    """The command class (``app.command(name, cls=listed(filters=method_names))``) whose option and argument help
    has each ``{field}`` replaced by ``", ".join(names[field]())`` when its help is shown."""

    class Listed(TyperCommand):
        def format_help(self, ctx: typer.Context, formatter) -> None:
            fields = {field: ", ".join(get()) for field, get in names.items()}
            for p in self.params:
                template = p.__dict__.setdefault("_help_template", getattr(p, "help", None))
                if template:
                    p.help = _FIELD.sub(lambda m: fields.get(m[1], m[0]), template)
            super().format_help(ctx, formatter)

    return Listed
