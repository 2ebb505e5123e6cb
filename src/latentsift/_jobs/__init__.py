"""The file-in/file-out jobs behind the commands, one module per command: each checks the options and the
output path before any work, reads its input files, runs the library's estimators and writes what the
command writes (the command line only parses and prints): ``imports`` (import), ``extract``, ``bank``
(bank build), ``scorer`` (scorer train), ``sifter`` (fit), ``filter``, ``verify``, ``evaluate``,
``explore``, ``crossval``, ``premise``, ``reproduce``, ``transfer`` and ``policy`` (fetch, verify)."""
from .bank import build_bank, build_bank_to_file
from .crossval import run_crossval
from .evaluate import run_evaluate
from .explore import write_explorer
from .extract import run_extract
from .filter import filter_options, filter_to_file, run_filter
from .imports import run_import
from .premise import run_premise
from .reproduce import ReproduceSettings
from .scorer import train_scorer, train_scorer_to_file
from .sifter import fit_sifter, run_sifter_filter, run_sifter_filter_chosen
from .transfer import transfer_matrix
from .verify import run_verify

__all__ = ["ReproduceSettings", "build_bank", "build_bank_to_file", "filter_options", "filter_to_file", "fit_sifter",
           "run_crossval", "run_evaluate", "run_extract", "run_filter", "run_import", "run_premise", "run_sifter_filter",
           "run_sifter_filter_chosen", "run_verify", "train_scorer", "train_scorer_to_file", "transfer_matrix",
           "write_explorer"]
