"""Progress for long stages: a rich bar on a terminal, plain timed lines otherwise.

When stdout is not a terminal (CI, ``make demo > log``) rich draws nothing until the end, so the
commands print one plain line per stage at a steady interval instead (done / total, the stage's own
info such as tokens/s, elapsed and ETA), plus one when a stage completes.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable, TextIO

#: Seconds between two plain progress lines of one stage (env LATENTSIFT_PROGRESS_INTERVAL overrides).
PLAIN_INTERVAL_S = 30.0


def messages():
    """A command's console for its messages (stderr). Lines are written whole (soft wrap) and the terminal
    folds them: rich would break a long path at 80 columns when the output is a log or a pipe, and a
    path cut in two cannot be copied."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class PlainProgress:
    """Line-per-interval progress for a non-terminal stream; ``update(stage, done, total, info)``."""

    def __init__(self, stream: TextIO | None = None, interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.stream = stream or sys.stdout
        env = os.environ.get("LATENTSIFT_PROGRESS_INTERVAL")
        self.interval = float(env) if interval is None and env else (PLAIN_INTERVAL_S if interval is None else interval)
        self.clock = clock
        self._start: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._finished: set[str] = set()

    def line(self, stage: str, done: int, total: int | None, info: str = "") -> str:
        elapsed = self.clock() - self._start.get(stage, self.clock())
        parts = [f"[{stage}]", f"{done:,}/{total:,}" if total else f"{done:,}"]
        if total:
            parts.append(f"({100 * done / total:.1f}%)")
        if info:
            parts.append(info)
        parts.append(f"elapsed {_clock(elapsed)}")
        if total and 0 < done < total:
            parts.append(f"ETA {_clock(elapsed * (total - done) / done)}")
        return "  ".join(parts)

    def update(self, stage: str, done: int, total: int | None, info: str = "") -> None:
        now = self.clock()
        if stage in self._finished and done == 0:  # the stage begins again (a command's second run): afresh
            self._finished.discard(stage)
            del self._start[stage]
        if stage not in self._start:
            self._start[stage] = now
            self._last[stage] = now
            self._emit(self.line(stage, done, total, info))
            return
        complete = bool(total) and done >= total
        if complete and stage in self._finished:
            return
        if complete or now - self._last[stage] >= self.interval:
            self._last[stage] = now
            if complete:
                self._finished.add(stage)
            self._emit(self.line(stage, done, total, info))

    def print(self, message: str) -> None:
        self._emit(message)

    def _emit(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


class StageProgress:
    """The commands' progress: ``with StageProgress(console) as p: p.update(stage, done, total, info)``
    and ``p.print(message)``; a rich bar when stdout is a terminal, :class:`PlainProgress` otherwise."""

    def __init__(self, console=None, *, transient: bool = False, plain: bool | None = None):
        self.console = console or messages()
        self.plain = (not sys.stdout.isatty()) if plain is None else plain
        self.transient = transient
        self._bar = None
        self._plain = PlainProgress() if self.plain else None
        self._tasks: dict[str, int] = {}

    def __enter__(self) -> "StageProgress":
        if not self.plain:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"),
                                 TimeRemainingColumn(), console=self.console, transient=self.transient)
            self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def update(self, stage: str, done: int, total: int | None, info: str = "") -> None:
        if self._plain is not None:
            self._plain.update(stage, done, total, info)
            return
        if stage not in self._tasks:
            self._tasks[stage] = self._bar.add_task(stage, total=total, info="")
        elif done == 0 and next(t for t in self._bar.tasks if t.id == self._tasks[stage]).finished:
            self._bar.reset(self._tasks[stage], total=total)  # the stage begins again: afresh, as plain lines
        self._bar.update(self._tasks[stage], completed=done, total=total, info=info)

    def print(self, message: str) -> None:
        if self._plain is not None:
            self._plain.print(message)
        else:
            self._bar.console.print(message, markup=False, highlight=False)
