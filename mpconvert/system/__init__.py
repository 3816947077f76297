"""The machine and the process: the one user-error type (errors.py), writing files and folders whole or
not at all (writing.py, outdir.py), object storage (objectstore.py, urls.py), content digests, signals and
interrupts, the running process, the user's own code (usercode.py), memory, library versions and how a
caller watches a run (hooks.py). No framework is imported here.
"""
