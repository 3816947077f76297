"""The command line: `mpconvert MODEL --policy ...` and its sub-commands.

commands.py holds the commands (parse flags into the API's options, call
it, no logic), flags.py the click options derived from the options'
declarations, outputs.py what a command prints and writes, process.py exit
codes, framework noise and signals.
"""

from mpconvert.cli.commands import cli, main

__all__ = ["cli", "main"]
