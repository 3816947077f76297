"""The key of a batch result: the job's options' cache key (`ConvertOptions.cache_key`), with this install's versions.

A changed model, option or TensorFlow version gives another key, and the
job converts again; the same files under another folder give the same key.
"""

from __future__ import annotations

from mpconvert.batch.manifest import Job
from mpconvert.report.report import mpconvert_version, versions


def job_key(job: Job) -> str:
    return job.options.cache_key(job.export, {**versions(), "mpconvert": mpconvert_version()})
