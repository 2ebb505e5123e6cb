"""One place that turns the errors a user can fix into a one-line message (exit code 2, no traceback).

``user_message(exc)`` returns that line, or ``None`` for a real bug (which keeps its traceback). The
command line (``latentsift.cli``) calls it around every command, so no command maps errors itself.
Covered: ``LatentSiftError``; a file system that refuses a write (permission, read-only, full disk,
quota); a missing or wrong-kind path; a truncated or corrupt archive; JSON that does not parse; text
that is not UTF-8. The error classes live here (``validation`` re-exports them): the command line maps
errors without importing numpy.
"""
from __future__ import annotations

import errno
import gzip
import json
import tarfile
import zlib


class LatentSiftError(ValueError):
    """A problem the user can fix (bad input, mismatched files). Printed without a traceback."""


class NotFittedError(LatentSiftError):
    """An estimator was used before ``fit``."""


class FingerprintMismatch(LatentSiftError):
    """States from different models were mixed."""


#: errno -> what went wrong and what to change.
_OS_ERRORS = {
    errno.EACCES: ("permission denied", "fix its permissions (an input must be readable, an output folder "
                   "writable), or choose another path"),
    errno.EPERM: ("operation not permitted", "fix its permissions (an input must be readable, an output folder "
                  "writable), or choose another path"),
    errno.EROFS: ("read-only file system", "choose an output on a writable file system"),
    errno.ENOSPC: ("no space left on device", "free some space or choose an output on another disk"),
    errno.EDQUOT: ("disk quota exceeded", "free some space or choose an output on another disk"),
    errno.ENOENT: ("no such file or directory", "check the path"),
    errno.ENOTDIR: ("not a directory", "check the path"),
    errno.EEXIST: ("already exists (a file where a folder is needed?)", "check the path"),
    errno.EISDIR: ("is a directory, not a file", "pass a file"),
    errno.ENAMETOOLONG: ("file name too long", "choose a shorter path"),
}


def user_message(exc: BaseException) -> str | None:
    """The one-line message for an error the user can fix, else ``None``."""
    if isinstance(exc, LatentSiftError):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno in _OS_ERRORS:
        what, fix = _OS_ERRORS[exc.errno]
        where = exc.filename if exc.filename is not None else "a file"
        return f"{where}: {what}; {fix}."
    if isinstance(exc, (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError)):
        return f"a compressed input is truncated or corrupt ({exc or type(exc).__name__}); re-create the archive."
    if isinstance(exc, json.JSONDecodeError):
        return f"an input is not valid JSON (line {exc.lineno}: {exc.msg}); fix the file."
    if isinstance(exc, UnicodeDecodeError):
        return f"an input is not UTF-8 text ({exc.reason} at byte {exc.start}); pass a UTF-8 file."
    return None
