"""The private base every subpackage builds on: errors and input validation (``validation``), the
user-facing fault messages (``errors``), atomic files and artefacts (``io``), fixed thread counts
(``threads``) and the output-path guard of the commands (``guard``). It imports nothing else of the
package."""
from .errors import user_message
from .guard import check_output
from .validation import (FingerprintMismatch, LatentSiftError, NotFittedError, check_choice, check_positive_int,
                         param_error)

__all__ = ["FingerprintMismatch", "LatentSiftError", "NotFittedError", "check_choice", "check_output",
           "check_positive_int", "param_error", "user_message"]
