"""Object storage as an output, for one conversion and for a batch: against moto's S3 server on 127.0.0.1.

A relay (a TCP proxy in this file) sits between mpconvert and the server: it
records the order of the uploads, and can drop every connection in the
middle of one, as a server going away does. The command runs in its own
process, so what aiohttp prints at exit would show on its stderr.
"""

import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import SAMPLES, console_script, invoke
from moto_s3 import moto_s3

import mpconvert

SECRET = "mpconvert-url-secret-0x5EC12E7"
FAST = ["--finetune-steps", "0", "--export", "savedmodel", "--no-speed", "--pad-multiple", "0"]


class Relay:
    """127.0.0.1:port -> the S3 server; records PUT paths; `drop_after` client bytes of PUT bodies, it goes away."""

    def __init__(self, target: tuple[str, int], drop_after: int | None = None):
        self.target = target
        self.drop_after = drop_after
        self.sent = 0
        self.puts: list[str] = []
        self.dropped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.dropped.is_set():
                client.close()
                continue
            server = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        try:
            while data := source.recv(65536):
                if upstream:
                    self.puts += [m.decode() for m in re.findall(rb"PUT (/[^ ?]*)", data)]
                    if self.puts:
                        self.sent += len(data)
                    if self.drop_after is not None and self.sent > self.drop_after:
                        self.go_away()
                        return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def go_away(self) -> None:
        """Every connection reset, and none accepted from now on: the server is gone."""
        self.dropped.set()
        self.listener.close()
        with self.lock:
            for s in self.sockets:
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    s.close()
                except OSError:
                    pass


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on 127.0.0.1 (dummy credentials in the environment) and an fsspec file system on it."""
    with moto_s3("zoo") as found:
        yield found


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    base = tmp_path_factory.mktemp("storage_model")
    (base / "cancer_mlp.keras").write_bytes((SAMPLES / "cancer_mlp.keras").read_bytes())
    (base / "breast_cancer.npz").write_bytes((SAMPLES / "data" / "breast_cancer.npz").read_bytes())
    return base


def objects(fs, prefix: str) -> dict[str, bytes]:
    fs.invalidate_cache()
    try:
        return {name[len(prefix) + 1 :]: fs.cat_file(name) for name in fs.find(prefix)}
    except FileNotFoundError:
        return {}


def run(args: list, cwd: Path, env: dict, tmp: Path) -> subprocess.CompletedProcess:
    """The console script in its own process, its temp folder (and so its staging) inside the test's."""
    (tmp / "tmp").mkdir(exist_ok=True)
    environment = {**os.environ, **env, "TMPDIR": str(tmp / "tmp"), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [console_script(), *map(str, args)], cwd=cwd, env=environment, capture_output=True, text=True, timeout=600
    )


def staging_left(tmp: Path) -> list[Path]:
    return [p for p in (tmp / "tmp").rglob("*") if p.is_file()] if (tmp / "tmp").exists() else []


def local_url_folders(*places: Path) -> list[Path]:
    """A folder named after a URL scheme ("s3:", "http:") that pathlib would have made of a URL."""
    return [p for place in places for p in place.rglob("*:") if p.is_dir()]


def assert_one_clear_error(stderr: str) -> None:
    assert "Traceback" not in stderr and "Task exception" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert "fix:" in stderr, stderr


def test_out_s3_for_one_conversion_is_uploaded_with_report_json_last(model, s3, tmp_path):
    env, fs, target = s3
    relay = Relay(target)
    through = {**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{relay.port}"}
    common = ["cancer_mlp.keras", "--policy", "mixed_bfloat16", "--data", "breast_cancer.npz", *FAST]
    remote = run([*common, "--out", "s3://zoo/single"], model, through, tmp_path)
    assert remote.returncode == 0, remote.stderr
    assert "s3://zoo/single/report.json" in remote.stdout + remote.stderr
    local = run([*common, "--out", tmp_path / "local"], model, env, tmp_path)
    assert local.returncode == 0, local.stderr
    stored = objects(fs, "zoo/single")
    written = {p.relative_to(tmp_path / "local").as_posix() for p in (tmp_path / "local").rglob("*") if p.is_file()}
    assert set(stored) == written
    assert json.loads(stored["report.json"])["gate"]["passed"]
    uploads = [path for path in relay.puts if path.startswith("/zoo/single/")]
    assert uploads[-1] == "/zoo/single/report.json" and len(uploads) == len(written), uploads
    assert not local_url_folders(model, tmp_path) and not staging_left(tmp_path)
    # A prefix that holds an output is refused without --force, as a non-empty folder is.
    again = run([*common, "--out", "s3://zoo/single"], model, env, tmp_path)
    assert again.returncode == 1 and "--force" in again.stderr, again.stderr
    assert_one_clear_error(again.stderr)


def test_the_server_going_away_mid_upload_is_one_clear_error_and_leaves_nothing(model, s3, tmp_path):
    env, fs, target = s3
    relay = Relay(target, drop_after=20_000)
    through = {**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{relay.port}"}
    args = ["cancer_mlp.keras", "--policy", "mixed_float16", "--data", "breast_cancer.npz", *FAST]
    result = run([*args, "--out", "s3://zoo/dropped"], model, through, tmp_path)
    assert relay.dropped.is_set()
    assert result.returncode == 1, result.stderr
    assert_one_clear_error(result.stderr)
    assert "s3://zoo/dropped/" in result.stderr  # which object failed
    assert "PASSED" not in result.stderr
    assert "report.json" not in objects(fs, "zoo/dropped")  # nothing partial counts as a result
    assert not staging_left(tmp_path)


def test_a_batch_whose_server_goes_away_keeps_the_first_error_and_leaves_no_staging(model, s3, tmp_path):
    env, fs, target = s3
    relay = Relay(target, drop_after=20_000)
    through = {**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{relay.port}"}
    (model / "zoo.toml").write_text(
        '[defaults]\nfinetune_steps = 0\nexport = ["savedmodel"]\nspeed = false\npad_multiple = 0\n'
        'data = "breast_cancer.npz"\n\n'
        '[[model]]\npath = "cancer_mlp.keras"\npolicy = ["mixed_float16", "mixed_bfloat16"]\n'
    )
    result = run(["batch", "zoo.toml", "--out", "s3://zoo/batch-dropped", "--jobs", "1"], model, through, tmp_path)
    assert relay.dropped.is_set()
    assert result.returncode == 1, result.stderr
    assert_one_clear_error(result.stderr)
    assert "cannot upload" in result.stderr, result.stderr
    stored = objects(fs, "zoo/batch-dropped")
    assert not [name for name in stored if name.endswith("batch_result.json")], sorted(stored)
    assert not staging_left(tmp_path)


@pytest.mark.parametrize("command", ["convert", "batch"])
def test_credentials_in_the_url_are_refused_without_echoing_them(model, s3, tmp_path, command):
    env, fs, _ = s3
    url = f"s3://user:{SECRET}@zoo/creds-{command}"
    if command == "convert":
        args = ["cancer_mlp.keras", "--policy", "mixed_bfloat16", *FAST, "--out", url]
    else:
        (model / "one.toml").write_text('[[model]]\npath = "cancer_mlp.keras"\npolicy = "mixed_bfloat16"\n')
        args = ["batch", "one.toml", "--out", url]
    result = run(args, model, env, tmp_path)
    assert result.returncode == 1, result.stderr
    assert SECRET not in result.stdout + result.stderr
    assert_one_clear_error(result.stderr)
    assert "credentials" in result.stderr and "AWS_ACCESS_KEY_ID" in result.stderr
    assert not local_url_folders(model, tmp_path) and not staging_left(tmp_path)


@pytest.mark.parametrize(
    ("url", "expected"),
    [("http://example.invalid/out", "cannot write to an http URL"), ("gs://bucket/out", "gcsfs")],
)
def test_an_output_url_mpconvert_cannot_write_is_refused_before_any_work(model, tmp_path, url, expected):
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        if url.startswith("gs:"):
            pytest.skip("gcsfs is installed here: gs:// works through it")
    result = run(["cancer_mlp.keras", "--policy", "mixed_bfloat16", *FAST, "--out", url], model, {}, tmp_path)
    assert result.returncode == 1, result.stderr
    assert expected in result.stderr
    assert_one_clear_error(result.stderr)
    assert not local_url_folders(model, tmp_path)


@pytest.mark.parametrize(
    "args",
    [
        ["s3://zoo/cancer_mlp.keras", "--policy", "mixed_bfloat16"],
        ["cancer_mlp.keras", "--policy", "mixed_bfloat16", "--data", "s3://zoo/data.npz"],
        ["cancer_mlp.keras", "--policy", "mixed_bfloat16", "--junit", "s3://zoo/junit.xml"],
        ["cancer_mlp.keras", "--policy", "mixed_bfloat16", "--summary", "s3://zoo/summary.md"],
        ["doctor", "s3://zoo/cancer_mlp.keras"],
        ["check", "s3://zoo/report.json"],
        ["batch", "s3://zoo/zoo.toml", "--out", "local-root"],
        ["verify", "s3://zoo/converted"],
        ["replay", "s3://zoo/converted/report.json"],
    ],
    ids=["model", "data", "junit", "summary", "doctor", "check", "manifest", "verify", "replay"],
)
def test_a_url_where_only_local_paths_work_is_refused_and_makes_no_s3_folder(model, tmp_path, args, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cancer_mlp.keras").write_bytes((model / "cancer_mlp.keras").read_bytes())
    extra = ["--out", "out", *FAST] if args[0] not in ("doctor", "check", "batch", "verify", "replay") else []
    result = invoke(*args, *extra)
    assert result.exit_code in (1, 2), result.output
    assert "URL" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not local_url_folders(tmp_path)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("call", ["convert", "verify"])
def test_the_python_api_refuses_a_url_for_a_local_input(tmp_path, monkeypatch, call):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(mpconvert.MpconvertError, match=r"s3://zoo/m\.keras is a URL; it must be a local path"):
        if call == "convert":
            mpconvert.convert("s3://zoo/m.keras", "mixed_float16")
        else:
            mpconvert.verify("s3://zoo/m.keras")
    assert not local_url_folders(tmp_path)


def test_conversion_save_to_a_url_uploads_it(model, s3, tmp_path):
    env, fs, _ = s3
    code = (
        "import sys, mpconvert\n"
        "c = mpconvert.convert('cancer_mlp.keras', 'mixed_bfloat16', data='breast_cancer.npz', finetune_steps=0,"
        " speed=False, pad_multiple=0)\n"
        "c.save('s3://zoo/api', export=('savedmodel',))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=model,
        env={**os.environ, **env, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    stored = objects(fs, "zoo/api")
    assert "report.json" in stored and "savedmodel/saved_model.pb" in stored
    assert not local_url_folders(model, tmp_path)
