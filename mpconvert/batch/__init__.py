"""Batch conversion of model zoos (`mpconvert batch`, `mpconvert batch-merge`).

manifest -> jobs (one per model and policy) -> runner (a worker process per
job, N at a time) -> results (batch.json, totals, baselines, merging). Each
worker runs the same pipeline as the CLI and the Python API.
"""
