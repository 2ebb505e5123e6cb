"""The file-in/file-out jobs behind the commands: each reads its input files, runs the library's
estimators and returns what the command writes (the command line only parses and prints)."""
from .bank import build_bank
from .filter import filter_options, run_filter
from .sifter import fit_sifter, run_sifter_filter, run_sifter_filter_chosen

__all__ = ["build_bank", "filter_options", "fit_sifter", "run_filter", "run_sifter_filter", "run_sifter_filter_chosen"]
