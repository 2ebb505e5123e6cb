"""The private base every subpackage builds on: errors and input validation (``validation``), the
user-facing fault messages (``errors``), atomic files and artefacts (``io``), fixed thread counts
(``threads``), the output-path checks of the commands (``outputs``) and the one registry of extension
points (``registry``), with the few words that name more than one thing (``words``). It imports nothing
else of the package."""
from .errors import user_message
from .outputs import check_output
from .validation import (FingerprintMismatch, LatentSiftError, NotFittedError, check_choice, check_positive_int,
                         param_error)

__all__ = ["FingerprintMismatch", "LatentSiftError", "NotFittedError", "check_choice", "check_output",
           "check_positive_int", "param_error", "user_message"]
