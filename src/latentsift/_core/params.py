"""A command's options declared once, with their constraints (scikit-learn's ``_parameter_constraints``).

A large command's settings object (``CommandOptions``: ``FilterOptions``, ``ExtractOptions``, ...) is a
frozen dataclass whose every field is declared with ``option``: the flag the user writes and the values it
allows, e.g.::

    @dataclass(frozen=True, kw_only=True)
    class FilterOptions(CommandOptions):
        command: ClassVar[str] = "filter"
        target_recall: float | None = option("--target-recall", Interval(Real, 0, 1, closed="right"), None)

Building it validates it, once, before any file or model is touched (``CommandOptions.__post_init__``): each
field against its constraints (a value passes when one of them allows it), then the object's cross-option
``rules`` (``Rule``: a contradiction and its message); the paths that must exist are checked by the job right
after it has taken its output (``check_paths``: an output over an input is refused first). The
refusal of a field is generated from its declaration: one line naming the command, the option as the user
writes it, what it allows and the value (``LatentSiftError``: exit code 2 on the command line), e.g.
``filter (--target-recall): --target-recall must be a number in (0, 1]. Got 1.5 instead.``

The constraints: ``Interval`` (an integer or a finite number between bounds, each end open or closed),
``OneOf`` (a fixed set of words), ``Registered`` (a registered name of a registry kind, read when checked),
``ExistingPath`` (a file or folder that must exist), ``Matches`` (text of a given form), ``Each`` (every
item of a repeated option), ``Kind`` (any value of a type: a flag, an output path) and None (the option
may be left out). ``invalid()`` of each makes a value it refuses: ``tests/test_command_options.py`` walks
every ``CommandOptions`` and tries one per parameter on the real command line, and breaks each of its rules.

The command line reads every default from here (``CommandOptions.defaults()``, by the parameter's name) and
checks each value once, by building the settings object; the job then calls the library's work without its
Python callers' checks of the same values (e.g. ``_run_filter`` for ``run_filter``).
"""
from __future__ import annotations

import math
import re
from dataclasses import MISSING, dataclass, field, fields
from numbers import Integral, Real
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Sequence

from .registry import registry_names
from .validation import LatentSiftError

__all__ = ["COUNT", "CommandOptions", "DEVICE", "Each", "ExistingPath", "FLAG", "Interval", "Kind", "Matches", "OUT",
           "OneOf", "POSITIVE", "Param", "RATE", "RAY_ADDRESS", "RECALL", "Registered", "Rule", "SEED", "STATE_STORE",
           "option", "options_classes", "parameters", "pattern"]

#: The key of a field's declaration in its ``dataclasses.field`` metadata.
PARAM = "latentsift_param"


class Constraint:
    """What one option allows: ``allows(value)``, its words (``describe``) and a value it refuses (``invalid``)."""

    def allows(self, value: Any) -> bool:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def invalid(self) -> Any:
        """A value this constraint refuses, as the command line would pass it (for the generated tests)."""
        raise NotImplementedError

    def why(self, value: Any) -> str:
        """A note on why ``value`` fails ('' when the words say it all)."""
        return ""


def _num(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Interval(Constraint):
    """A number of ``kind`` (``numbers.Integral`` or ``numbers.Real``) between ``left`` and ``right``
    (None: unbounded), ``closed`` at "both" ends, "left", "right" or "neither"; a real must be finite."""

    kind: type
    left: float | None
    right: float | None
    closed: str = "both"

    def _closed(self, side: str) -> bool:
        return self.closed in (side, "both")

    def allows(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, self.kind if self.kind is Integral else Real):
            return False
        if not math.isfinite(value):
            return False
        if self.left is not None and not (value > self.left or (value == self.left and self._closed("left"))):
            return False
        return self.right is None or value < self.right or (value == self.right and self._closed("right"))

    def describe(self) -> str:
        noun = "an integer" if self.kind is Integral else "a number"
        lo, hi = self.left, self.right
        if hi is None:
            if lo is None:
                return noun
            if (lo == 0 and not self._closed("left")) or (lo == 1 and self._closed("left") and self.kind is Integral):
                return f"a positive {noun.split()[-1]}"
            return f"{noun} {'of at least' if self._closed('left') else 'above'} {_num(lo)}"
        if lo is None:
            return f"{noun} {'of at most' if self._closed('right') else 'below'} {_num(hi)}"
        if self.closed == "both":
            return f"{noun} from {_num(lo)} to {_num(hi)}"
        return (f"{noun} in {'[' if self._closed('left') else '('}{_num(lo)}, {_num(hi)}"
                f"{']' if self._closed('right') else ')'}")

    def invalid(self) -> Any:
        if self.left is not None:
            return self.left - 1 if self._closed("left") else self.left
        return self.right + 1 if self._closed("right") else self.right


@dataclass(frozen=True)
class OneOf(Constraint):
    """One of a fixed set of words."""

    options: tuple[str, ...]

    def allows(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.options

    def describe(self) -> str:
        return " or ".join(self.options) if len(self.options) <= 2 else "one of " + ", ".join(self.options)

    def invalid(self) -> Any:
        return "no-such-value"


@dataclass(frozen=True)
class Registered(Constraint):
    """The name of a registered extension of ``kind`` (``_core.registry``; plugins load on the first look)."""

    kind: str

    def allows(self, value: Any) -> bool:
        return isinstance(value, str) and value in registry_names(self.kind)

    def describe(self) -> str:
        return f"a registered {self.kind.replace('_', ' ')}: {', '.join(registry_names(self.kind))}"

    def invalid(self) -> Any:
        return f"no-such-{self.kind.replace('_', '-')}"


@dataclass(frozen=True)
class Named(Constraint):
    """One of the words ``words()`` gives when asked (a list its owner computes from the registry, e.g.
    ``fit --method``'s deployable methods); ``noun`` names them."""

    noun: str
    words: Callable[[], Sequence[str]]

    def allows(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.words()

    def describe(self) -> str:
        return f"{self.noun}: {', '.join(self.words())}"

    def invalid(self) -> Any:
        return "no-such-name"


@dataclass(frozen=True)
class ExistingPath(Constraint):
    """A path that exists: a "file", a "folder" or either ("path"); ``noun`` names it in the message (default:
    "an existing <what>") and ``missing`` says what is missing when nothing is there."""

    what: str = "path"
    noun: str = ""
    missing: str = "it does not exist"

    def allows(self, value: Any) -> bool:
        if not isinstance(value, (str, Path)):
            return False
        p = Path(value)
        return {"file": p.is_file, "folder": p.is_dir}.get(self.what, p.exists)()

    def describe(self) -> str:
        return self.noun or f"an existing {self.what}"

    def invalid(self) -> Any:
        return Path("/nonexistent-latentsift-input") / self.what

    def why(self, value: Any) -> str:
        return self.missing if not Path(value).exists() else f"not a {self.what}"


#: A state store folder (``latentsift extract`` or ``rollout``).
STATE_STORE = ExistingPath("folder", "a state store folder ('latentsift extract')", "no state store at that path")


@dataclass(frozen=True)
class Matches(Constraint):
    """Text that ``test`` accepts (e.g. a comma-separated list of channels), told by ``words``; ``bad`` is a
    value it refuses."""

    words: str
    test: Callable[[str], bool]
    bad: str

    def allows(self, value: Any) -> bool:
        return isinstance(value, str) and bool(self.test(value))

    def describe(self) -> str:
        return self.words

    def invalid(self) -> Any:
        return self.bad


def pattern(regex: str) -> Callable[[str], bool]:
    """A ``Matches`` test: the whole text matches ``regex``."""
    return lambda text: re.fullmatch(regex, text) is not None


@dataclass(frozen=True)
class Kind(Constraint):
    """Any value of a type, e.g. a flag's bool or an output path: nothing the command line could pass refuses it."""

    kind: type
    words: str

    def allows(self, value: Any) -> bool:
        return isinstance(value, self.kind)

    def describe(self) -> str:
        return self.words

    def invalid(self) -> Any:
        return None


@dataclass(frozen=True)
class Each(Constraint):
    """Every item of a repeated option allows ``item`` (the refusal names the first that does not)."""

    item: Constraint

    def allows(self, value: Any) -> bool:
        return isinstance(value, (list, tuple)) and all(self.item.allows(v) for v in value)

    def describe(self) -> str:
        return self.item.describe() + " (each)"

    def invalid(self) -> Any:
        bad = self.item.invalid()
        return None if bad is None else [bad]

    def why(self, value: Any) -> str:
        return self.item.why(value)


@dataclass(frozen=True)
class Param:
    """One parameter of a settings object: its ``flag`` as the user writes it and its ``constraints``
    (None among them: the option may be left out)."""

    flag: str
    constraints: tuple

    def allows(self, value: Any) -> bool:
        if value is None:
            return None in self.constraints
        return any(c.allows(value) for c in self.constraints if c is not None)

    def describe(self) -> str:
        return " or ".join(c.describe() for c in self.constraints if c is not None)

    def refusal(self, command: str, value: Any) -> LatentSiftError:
        """The one line that refuses ``value``, from the declaration."""
        shown = value
        for c in self.constraints:
            if isinstance(c, Each) and isinstance(value, (list, tuple)):
                shown = next((v for v in value if not c.item.allows(v)), value)
        notes = [c.why(shown) for c in self.constraints if c is not None and shown is not None]
        note = next((n for n in notes if n), "")
        return LatentSiftError(f"{command} ({self.flag}): {self.flag} must be {self.describe()}. Got "
                               f"{_shown(shown)} instead{f' ({note})' if note else ''}.")

    def bad_value(self) -> Any:
        """A value that no constraint allows (None when every value passes, e.g. a flag)."""
        for c in self.constraints:
            if c is not None:
                v = c.invalid()
                if v is not None and not self.allows(v):
                    return v
        return None

    @property
    def on_disk(self) -> bool:
        """Whether a constraint asks the file system (``CommandOptions.check_paths``)."""
        return any(isinstance(c, ExistingPath) or isinstance(c, Each) and isinstance(c.item, ExistingPath)
                   for c in self.constraints)


def _shown(value: Any) -> str:
    return repr(str(value)) if isinstance(value, Path) else repr(value)


def option(flag: str, *constraints, default: Any = MISSING) -> Any:
    """A settings field declared with its ``flag`` and ``constraints`` (see ``Param``)."""
    meta = {PARAM: Param(flag, tuple(constraints))}
    return field(metadata=meta) if default is MISSING else field(default=default, metadata=meta)


@dataclass(frozen=True)
class Rule:
    """A cross-option rule: ``broken(settings)`` True refuses the settings with ``message`` (a text, or a
    function of the settings for one that names the values)."""

    broken: Callable[[Any], bool]
    message: str | Callable[[Any], str]

    def check(self, settings: Any) -> None:
        if self.broken(settings):
            raise LatentSiftError(self.message(settings) if callable(self.message) else self.message)


@dataclass(frozen=True)
class CommandOptions:
    """A command's settings object: every field declared with ``option``, named as the command's parameter;
    built = validated (the values, then ``rules``); the paths that must exist when the job has taken its
    output (``check_paths``)."""

    command: ClassVar[str] = ""
    rules: ClassVar[Sequence[Rule]] = ()

    def __post_init__(self) -> None:
        self._check(on_disk=False)
        for rule in self.rules:
            rule.check(self)

    def check_paths(self) -> None:
        """The constraints that ask the file system (``ExistingPath``), checked by the job once it has taken its
        output: a second writer or an output over an input is refused first, as before any input is read."""
        self._check(on_disk=True)

    def _check(self, *, on_disk: bool) -> None:
        for name, p in parameters(type(self)).items():
            value = getattr(self, name)
            if p.on_disk == on_disk and not p.allows(value):
                raise p.refusal(self.command, value)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The declared defaults (a field without one is left out)."""
        return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


def parameters(cls: type) -> dict[str, Param]:
    """field name -> its declaration, in field order, of a settings class."""
    return {f.name: f.metadata[PARAM] for f in fields(cls) if PARAM in f.metadata}


def options_classes(root: type = CommandOptions) -> Iterator[type]:
    """Every command's settings class defined so far (subclasses of ``root``, depth first)."""
    for sub in root.__subclasses__():
        yield sub
        yield from options_classes(sub)


# ---------------------------------------------------------------- constraints several commands declare
#: A positive count (``--workers``, ``--shard-size``, ...).
POSITIVE = Interval(Integral, 1, None)
#: Bootstrap resamples (``--bootstrap``): an interval needs two or more.
BOOTSTRAP = Interval(Integral, 2, None)
#: A count that may be 0 (``--evidence``, ``--show``) and a seed.
COUNT = Interval(Integral, 0, None)
SEED = COUNT
#: A flag: ``--x`` / ``--no-x``.
FLAG = Kind(bool, "a flag")
#: Where a command writes (``--out``; ``_core.outputs`` guards it when the command runs).
OUT = Kind(Path, "an output path")
#: A probability strictly between 0 and 1 (``--confidence``, ``--guard-false-alarm``) and a target pool
#: recall in (0, 1] (``--target-recall``).
RATE = Interval(Real, 0, 1, closed="neither")
RECALL = Interval(Real, 0, 1, closed="right")
#: ``--ray``: where Ray runs.
RAY_ADDRESS = Matches("local, auto or HOST:PORT", pattern(r"local|auto|\S*[^\s:]:\d+"), "nowhere")
#: ``--device``: the policy's torch device.
DEVICE = Matches("cpu or cuda", pattern(r"cpu|cuda(:\d+)?"), "tpu")
