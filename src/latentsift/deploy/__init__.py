"""Filtering new pools in deployment: the ``Sifter`` (bank, scorer and shift guard fitted and saved
as one; ``sifter``), a library of banks to choose from (``library``), the shift guard (``shift``),
the leak guard (``leak``) and the calibrated keep rule for a target pool recall (``operating``)."""
from .leak import check_leaks
from .library import SubBank, load_runs
from .operating import OperatingPoint, apply_operating_point, fit_operating_point
from .shift import Reference, guard
from .sifter import Sifter

__all__ = ["OperatingPoint", "Reference", "Sifter", "SubBank", "apply_operating_point", "check_leaks",
           "fit_operating_point", "guard", "load_runs"]
