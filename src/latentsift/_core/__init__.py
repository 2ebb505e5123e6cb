"""The private base every subpackage builds on: errors and input validation (``validation``), the
user-facing fault messages (``errors``), atomic files and artefacts (``io``), fixed thread counts
(``threads``), the output-path checks of the commands (``outputs``) and the one registry of extension
points (``registry``), with the few words that name more than one thing (``words``). It imports nothing
else of the package.

The names below are imported on first access (PEP 562 ``__getattr__``), so importing one module of
``_core`` (the command line's ``errors``) does not import numpy or pydantic with the others."""
import importlib

#: name -> the module of ``_core`` that defines it.
_LAZY = {"FingerprintMismatch": "errors", "LatentSiftError": "errors", "NotFittedError": "errors",
         "user_message": "errors", "check_output": "outputs", "check_choice": "validation",
         "check_positive_int": "validation", "param_error": "validation"}

__all__ = ["FingerprintMismatch", "LatentSiftError", "NotFittedError", "check_choice", "check_output",
           "check_positive_int", "param_error", "user_message"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
