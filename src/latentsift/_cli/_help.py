"""The commands' help: metavars as click writes them, and option help that lists registered names.

Every command's class is ``listed(...)``: its help shows each option's value as click does (``PATH``,
``INTEGER``, ``TEXT``, the choices ``[auto|canonical|...]``) and each argument by its name (``POOLS...``
when it takes several), not typer's annotations (``<list[Path]>``, ``<str>``); the choices are read from
the command's settings object (``OneOf`` and ``Registered`` declarations, ``latentsift._core.params``) or
given by name. Its option and argument help has each ``{field}`` filled when the help is shown, not when
the command line is imported: listing a kind loads the plugins (``latentsift._core.registry``), and
``latentsift --help`` or a command that lists nothing should import none of them.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable

import typer
from typer.core import TyperCommand

from .._core.params import Named, OneOf, Registered, parameters
from .._core.registry import registry_names

_FIELD = re.compile(r"\{(\w+)\}")
#: A value's type as click names it (typer 0.29 writes the annotation instead: ``<list[Path]>``).
#: The most characters of a set of words shown whole (``[a|b|...]`` beyond).
_MAX_CHOICES = 32
_CLICK_TYPES = {"int": "INTEGER", "float": "FLOAT", "str": "TEXT", "bool": "BOOLEAN", "Path": "PATH"}


def choices_of(settings: type | None) -> dict[str, Callable[[], Iterable[str]]]:
    """parameter name -> its allowed words, of each ``OneOf`` or ``Registered`` field of a settings class."""
    out: dict[str, Callable[[], Iterable[str]]] = {}
    for name, p in (parameters(settings) if settings is not None else {}).items():
        for c in p.constraints:
            if isinstance(c, OneOf):
                out[name] = lambda c=c: c.options
            elif isinstance(c, Registered):
                out[name] = lambda c=c: registry_names(c.kind)
            elif isinstance(c, Named):
                out[name] = c.words
    return out


def argument_metavar(p) -> str:
    """An argument as click's usage writes it: its name, ``...`` when it takes several, in brackets when optional."""
    name = p.metavar or (p.name or "").upper()
    name = name if p.required else f"[{name}]"
    return name + ("..." if p.nargs != 1 else "")


def _words(words: list[str], n: int) -> str:
    """The first ``n`` of ``words`` as click's choices, ``...`` for the rest."""
    return f"[{'|'.join(words[:n] + (['...'] if n < len(words) else []))}]"


def option_metavar(p, ctx: typer.Context, choices: Iterable[str] | None = None) -> str:
    """An option's value as click writes it: ``[a|b|c]`` for a set of words (the first ones and ``...`` where they
    are many: the help text or the refusal lists them all), else its type (PATH, INTEGER...)."""
    if choices is not None:
        words = list(choices)
        n = len(words)
        while n > 1 and len(_words(words, n)) > _MAX_CHOICES:
            n -= 1
        return _words(words, n)
    if p.type_descriptor.is_path:
        return "PATH"
    label = p.bare_type()   # typer's 'int', 'list[Path]', ...
    label = label[len("list["):-1] if label.startswith("list[") else label
    return _CLICK_TYPES.get(label, label.upper())


def listed(settings: type | None = None, choices: dict[str, Callable[[], Iterable[str]]] | None = None,
           **names: Callable[[], Iterable[str]]) -> type[TyperCommand]:
    """The command class (``app.command(name, cls=listed(CrossvalOptions, filters=method_names))``): click's
    metavars, the choices of ``settings`` and ``choices`` (parameter name -> its words), and each ``{field}``
    of a parameter's help replaced by ``", ".join(names[field]())`` when the help is shown."""
    words = {**choices_of(settings), **(choices or {})}

    class Listed(TyperCommand):
        def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
            return [self.options_metavar, *(argument_metavar(p) for p in self.get_params(ctx)
                                            if p.param_type_name == "argument")]

        def format_help(self, ctx: typer.Context, formatter) -> None:
            fields = {field: ", ".join(get()) for field, get in names.items()}
            for p in self.params:
                template = p.__dict__.setdefault("_help_template", getattr(p, "help", None))
                if template:
                    p.help = _FIELD.sub(lambda m: fields.get(m[1], m[0]), template)
            super().format_help(ctx, formatter)

        def format_options(self, ctx: typer.Context, formatter) -> None:
            args, opts = [], []
            for p in self.get_params(ctx):
                record = p.get_help_record(ctx)
                if record is None:
                    continue
                if p.param_type_name == "argument":
                    args.append((argument_metavar(p), record[1]))
                    continue
                name = record[0]
                if not p.is_flag and not p.count:
                    typed = p.display_type_rich(ctx)
                    shown = option_metavar(p, ctx, words[p.name]() if p.name in words else None)
                    name = name.replace(f" {typed}", f" {shown}")
                opts.append((name, record[1]))
            for title, rows in (("Arguments", args), ("Options", opts)):
                if rows:
                    with formatter.section(title):
                        formatter.write_dl(rows)

    return Listed
