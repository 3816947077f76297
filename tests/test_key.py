"""A batch result's key: every options field that can change a result is in it, files by content, paths not."""

import shutil

import pytest
from option_values import changed_values, every_field, option_fields, replaced, value_for

from mpconvert.api import conversion_options, export_options
from mpconvert.batch.key import NOT_KEYED, job_key
from mpconvert.batch.manifest import Job
from mpconvert.options.convert import ConvertOptions

FILES = {"m.keras": b"model bytes", "d.npz": b"data bytes", "b.json": b'{"baseline": 1}'}


def files_in(folder, contents=FILES):
    folder.mkdir(parents=True)
    for name, content in contents.items():
        (folder / name).write_bytes(content)
    return folder


def job_in(folder) -> Job:
    """What a manifest beside these files makes: absolute paths, data and baseline given."""
    options = conversion_options(
        folder / "m.keras", "mixed_float16", data=str(folder / "d.npz"), baseline=folder / "b.json"
    )
    return Job("m", options, export_options(), "m.keras")


@pytest.fixture
def base(tmp_path):
    return job_in(files_in(tmp_path / "here"))


def test_the_same_files_in_another_folder_give_the_same_key(base, tmp_path):
    elsewhere = tmp_path / "there" / "deeper"
    shutil.copytree(base.model.parent, elsewhere)
    moved = job_in(elsewhere)
    assert moved.options != base.options  # the paths differ...
    assert job_key(moved) == job_key(base)  # ...the content does not


def test_every_field_that_can_change_a_result_changes_the_key(base, tmp_path):
    # The model copied elsewhere (its path is not keyed); data and baseline with other content.
    other = files_in(tmp_path / "other", {**FILES, "d.npz": b"other data", "b.json": b'{"baseline": 2}'})
    values = changed_values(other / "m.keras", other / "d.npz", other / "b.json")
    key = job_key(base)
    conversion_fields = {o.path for o in option_fields(ConvertOptions)}
    for option in every_field():
        value = value_for(values, option)
        if option.path in conversion_fields:
            job = Job(base.name, replaced(base.options, option.path, value), base.export, base.given_path)
        else:
            job = Job(base.name, base.options, replaced(base.export, option.path, value), base.given_path)
        if option.name in NOT_KEYED:
            assert job_key(job) == key, f"{option.name} is in NOT_KEYED but changes the key"
        else:
            assert job_key(job) != key, f"{option.name} can change a result but not the key"


def test_a_changed_file_changes_the_key(base):
    key = job_key(base)
    (base.model.parent / "d.npz").write_bytes(b"data bytes, edited")
    assert job_key(base) != key
    (base.model.parent / "d.npz").write_bytes(FILES["d.npz"])
    assert job_key(base) == key
    (base.model.parent / "b.json").write_bytes(b'{"baseline": 3}')
    assert job_key(base) != key


def test_not_keyed_names_only_real_fields():
    assert set(NOT_KEYED) <= {o.name for o in every_field()}
