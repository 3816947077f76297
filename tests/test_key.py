"""A batch result's key: every options field that can change a result is in it, files by content, paths not."""

import shutil

import pytest
from option_values import changed_values, every_field, option_fields, replaced, value_for

from mpconvert.api import conversion_options, export_options
from mpconvert.batch.key import job_key
from mpconvert.batch.manifest import Job
from mpconvert.options.convert import ConvertOptions
from mpconvert.options.keywords import is_keyed

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
        if not is_keyed(option.field):
            assert job_key(job) == key, f"{option.name} is declared keyed=False but changes the key"
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


def test_only_the_model_path_and_python_objects_are_left_out():
    assert {o.name for o in every_field() if not is_keyed(o.field)} == {
        "LoadOptions.source",  # the model's files are in the key by content
        "LoadOptions.custom_objects",  # the Python API's alone: a batch job never has any
    }


def test_a_key_stays_the_same_across_mpconvert_changes_that_keep_the_options(base):
    """A batch root made before must still --resume: the key of the same job and versions is pinned.

    The value was computed before the options moved into options/ by concept
    and the cache key became ConvertOptions.cache_key. A refactoring must
    keep it; a new option or a changed default changes it rightly (a result
    made without it is another result): then update the value here.
    """
    versions = {"python": "3.12.0", "tensorflow": "2.21.0", "keras": "3.15.1", "tf_keras": None}
    versions |= {"tf2onnx": "1.17.0", "onnx": "1.19", "onnxruntime": "1.31", "mpconvert": "0.9"}
    key = base.options.cache_key(base.export, versions)
    assert key == "5033806f712065bd899f5f83bbc910bd587ef4dbbed99fa964c52195fee75d78"
