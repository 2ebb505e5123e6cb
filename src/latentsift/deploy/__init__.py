"""Filtering new pools in deployment: the ``Sifter`` (bank, scorer and shift guard fitted and saved
as one; ``sifter``), a library of banks to choose from (``library``), the shift guard (``shift``),
the leak guard (``leak``) and the recall-targeted keep rule applied to new pools (``operating``; the rule is ``sift.keep``),
saved beside a sifter and loaded again (``operating_file``)."""
from .leak import check_leaks
from .library import SubBank, load_runs
from .operating import apply_operating_point, target_recall_filter
from .operating_file import load_operating_point
from .shift import Reference, guard
from .sifter import Sifter

__all__ = ["Reference", "Sifter", "SubBank", "apply_operating_point", "check_leaks", "guard", "load_operating_point",
           "load_runs", "target_recall_filter"]
