"""The file-in/file-out jobs behind the commands: each reads its input files, runs the library's
estimators and returns what the command writes (the command line only parses and prints)."""
from .filter import filter_options, run_filter

__all__ = ["filter_options", "run_filter"]
