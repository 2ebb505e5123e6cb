"""The file-in/file-out jobs behind the commands, one module per command: each checks the options and the
output path before any work, reads its input files, runs the library's estimators and writes what the
command writes (the command line only parses and prints): ``imports`` (import), ``extract``, ``bank``
(bank build), ``scorer`` (scorer train), ``sifter`` (fit), ``filter``, ``verify``, ``evaluate``,
``explore``, ``crossval``, ``premise``, ``reproduce``, ``transfer`` and ``policy`` (fetch, verify).

Nothing is re-exported here: a command imports its own job module (``latentsift._jobs.<name>``) and no
other, so one command's start does not pay for every command's library."""
__all__: list[str] = []
