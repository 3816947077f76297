"""Signed output folders: `--sign-key`, `mpconvert sign`, `verify --public-key`, with real keys and model-signing.

One real conversion of sample_models/cancer_mlp.keras, signed, is the
module's folder; each fault is made in a copy of it the way a forger or a
damaged copy makes it (a flipped byte, an ONNX file swapped with its hashes
rewritten in report.json, a file added, another key's signature, no
signature). A folder whose signature fails has no artifact loaded, so those
cases cost no run. Keys are P-256 pairs made in the test (signing_keys.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import SAMPLES, invoke
from moto_s3 import moto_s3
from onnx import numpy_helper
from signing_keys import key_pair

import mpconvert

model_signing = pytest.importorskip("model_signing.verifying")

CANCER = SAMPLES / "cancer_mlp.keras"
CANCER_NPZ = SAMPLES / "data" / "breast_cancer.npz"
FAST = ["--policy", "mixed_bfloat16", "--finetune-steps", "0", "--no-speed"]
PASSWORD_ENV = "MPCONVERT_SIGN_KEY_PASSWORD"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    base = tmp_path_factory.mktemp("keys")
    return {"ours": key_pair(base, "ours"), "theirs": key_pair(base, "theirs")}


@pytest.fixture(scope="module")
def signed(tmp_path_factory, keys):
    """cancer_mlp converted to mixed_bfloat16 (SavedModel + model.keras + ONNX), signed at conversion."""
    out = tmp_path_factory.mktemp("signed") / "out"
    result = invoke(
        CANCER, *FAST, "--data", CANCER_NPZ, "--export", "savedmodel,onnx", "--sign-key", keys["ours"][0], "--out", out
    )
    assert result.exit_code == 0, result.output
    return out


def copy_of(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / "copy"))


def verified(folder: Path, *flags) -> tuple[int, dict]:
    result = invoke("verify", folder, *flags, "--json")
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else {}


def library_verifies(folder: Path, public: Path, signature: str = "model.sig") -> None:
    """model-signing's own verifier, configured as its CLI is: the signed manifest says what it left out."""
    model_signing.Config().use_elliptic_key_verifier(public_key=public).verify(folder, folder / signature)


def test_a_signed_folder_passes_verify_and_model_signings_own_verifier(signed, keys):
    private, public = keys["ours"]
    record = json.loads((signed / "signing.json").read_text())
    code, found = verified(signed, "--public-key", public, "--artifacts", "savedmodel")
    assert code == 0, found
    assert found["checks"][0]["name"] == "signature" and found["checks"][0]["passed"]  # checked first
    signature = found["signature"]
    # Who and when: the key the bundle names (sha256 of the public PEM), the time and key path signing.json holds.
    bundle = json.loads((signed / "model.sig").read_text())
    assert signature["signer"] == bundle["verificationMaterial"]["publicKey"]["hint"] == record["public_key_sha256"]
    assert signature["signed_at"] == record["signed_at"] and signature["key"] == str(private.absolute())
    assert record["signed_at"] in signature["message"] and signature["changed"] == []
    # The manifest covers every file but the signature itself; verify.json (written by verify) is left out.
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    covered = {r["name"]: r["digest"] for r in statement["predicate"]["resources"]}
    on_disk = {p.relative_to(signed).as_posix() for p in signed.rglob("*") if p.is_file()}
    assert set(covered) == on_disk - {"model.sig", "verify.json"}
    assert {"report.json", "golden.npz", "model.onnx", "model.keras", "signing.json"} <= set(covered)
    assert covered["report.json"] == sha256(signed / "report.json")
    library_verifies(signed, public)  # with verify.json now in the folder too
    # The key's path is recorded, never its content.
    pem_body = private.read_text().splitlines()[1]
    for name in ("report.json", "signing.json", "verify.json"):
        assert pem_body not in (signed / name).read_text()


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def forge_figure(path: Path) -> None:
    """report.json still valid, one figure better than measured."""
    report = json.loads(path.read_text())
    report["validation"]["max_abs_diff"] = 0.0
    path.write_text(json.dumps(report, indent=2))


def forge_onnx(folder: Path) -> None:
    """The forgery verify could not see: model.onnx's largest weight scaled by 1.5, its hash rewritten in report.json."""
    model = onnx.load(folder / "model.onnx")
    largest = max(model.graph.initializer, key=lambda t: t.ByteSize())
    scaled = numpy_helper.to_array(largest) * np.asarray(1.5, numpy_helper.to_array(largest).dtype)
    largest.CopyFrom(numpy_helper.from_array(scaled, largest.name))
    onnx.save(model, folder / "model.onnx")
    report = json.loads((folder / "report.json").read_text())
    for artifact in report["artifacts"]:
        if artifact["kind"] == "onnx":
            artifact["sha256"], artifact["bytes"] = (
                sha256(folder / "model.onnx"),
                (folder / "model.onnx").stat().st_size,
            )
    (folder / "report.json").write_text(json.dumps(report, indent=2))


@pytest.mark.parametrize(
    "fault,named",
    [
        (lambda f: forge_figure(f / "report.json"), "report.json changed"),
        (lambda f: flip_byte(f / "golden.npz"), "golden.npz changed"),
        (lambda f: flip_byte(f / "savedmodel" / "saved_model.pb"), "savedmodel/saved_model.pb changed"),
        (forge_onnx, "model.onnx changed, report.json changed"),
        (lambda f: (f / "notes.txt").write_text("added later"), "notes.txt added"),
        (lambda f: (f / "model.keras").unlink(), "model.keras missing"),
    ],
    ids=["report-figure", "golden-byte", "savedmodel-byte", "forged-onnx", "file-added", "file-removed"],
)
def test_a_folder_changed_after_signing_fails_naming_the_file_and_loads_nothing(signed, keys, tmp_path, fault, named):
    copy = copy_of(signed, tmp_path)
    fault(copy)
    code, found = verified(copy, "--public-key", keys["ours"][1], "--artifacts", "onnx")
    assert code == 3
    signature = found["signature"]
    assert not signature["passed"] and named in signature["message"], signature
    assert named.split(", ")[0] in signature["changed"]
    # Nothing of a folder nobody vouches for is loaded: its runs are skipped, named.
    assert [a["skipped"] for a in found["artifacts"]] == ["the folder's signature failed: its files are not trusted"]
    with pytest.raises(ValueError):  # the library's own verifier agrees
        library_verifies(copy, keys["ours"][1])


def test_the_forgery_passes_the_hashes_but_not_the_signature(signed, keys, tmp_path):
    copy = copy_of(signed, tmp_path)
    forge_onnx(copy)
    code, found = verified(copy, "--public-key", keys["ours"][1], "--artifacts", "onnx")
    assert code == 3
    hashes = {c["name"]: c["passed"] for c in found["checks"] if c["name"].startswith("hash: ")}
    assert hashes == {"hash: model.onnx": True, "hash: golden.npz": True}  # what verify alone could see


def test_an_unreadable_report_of_a_folder_whose_signature_fails_is_a_failed_check(signed, keys, tmp_path):
    copy = copy_of(signed, tmp_path)
    (copy / "report.json").write_text((copy / "report.json").read_text()[:100])
    result = invoke("verify", copy, "--public-key", keys["ours"][1])
    assert result.exit_code == 3 and result.stderr.count("error: ") == 1 and "  fix: " in result.stderr
    assert "report.json changed" in result.stderr


def test_another_keys_signature_and_an_unsigned_folder_fail(signed, keys, tmp_path):
    code, found = verified(signed, "--public-key", keys["theirs"][1], "--artifacts", "onnx")
    assert code == 3 and "signed by another key" in found["signature"]["message"]
    assert found["signature"]["signer"] == json.loads((signed / "signing.json").read_text())["public_key_sha256"]
    copy = copy_of(signed, tmp_path)
    (copy / "model.sig").unlink()
    code, found = verified(copy, "--require-signature", "--public-key", keys["ours"][1], "--artifacts", "onnx")
    assert code == 3 and found["signature"]["message"].startswith("model.sig is missing"), found["signature"]
    # --require-signature without a key to check with fails even a signed folder: nothing was proven.
    code, found = verified(signed, "--require-signature", "--artifacts", "onnx")
    assert code == 3 and "needs --public-key" in found["signature"]["message"]


def test_sign_refuses_a_damaged_folder_and_signs_an_intact_one(signed, keys, tmp_path):
    private, public = keys["ours"]
    copy = copy_of(signed, tmp_path)
    for name in ("model.sig", "signing.json"):
        (copy / name).unlink()
    before = sha256(copy / "model.onnx")
    flip_byte(copy / "model.onnx")
    result = invoke("sign", copy, "--key", private)
    assert result.exit_code == 1 and result.stderr.count("error: ") == 1 and "  fix: " in result.stderr
    assert "model.onnx has changed" in result.stderr and before[:12] in result.stderr
    assert not (copy / "model.sig").exists() and not (copy / "signing.json").exists()
    flip_byte(copy / "model.onnx")  # back as written
    assert invoke("sign", copy, "--key", private).exit_code == 0
    library_verifies(copy, public)
    # Signed already: replacing the signature is asked for, not done by the way.
    again = invoke("sign", copy, "--key", keys["theirs"][0])
    assert again.exit_code == 1 and "--force" in again.stderr
    assert mpconvert.sign(copy, sign_key=keys["theirs"][0], force=True) == [copy.absolute()]
    library_verifies(copy, keys["theirs"][1])


def test_key_hygiene_a_readable_key_warns_and_an_encrypted_one_takes_its_password_from_the_environment(
    signed, tmp_path, monkeypatch
):
    copy = copy_of(signed, tmp_path)
    (copy / "model.sig").unlink()
    readable, _ = key_pair(tmp_path, "readable", mode=0o644)
    result = invoke("sign", copy, "--key", readable)
    assert result.exit_code == 0 and "chmod 600" in result.stderr and "0644" in result.stderr
    assert stat.S_IMODE(readable.stat().st_mode) == 0o644  # warned about, not changed
    locked, public = key_pair(tmp_path, "locked", password=b"s3cret-passphrase")
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    result = invoke("sign", copy, "--key", locked, "--force")
    assert result.exit_code == 1 and PASSWORD_ENV in result.stderr and result.stderr.count("error: ") == 1
    monkeypatch.setenv(PASSWORD_ENV, "wrong")
    assert invoke("sign", copy, "--key", locked, "--force").exit_code == 1
    monkeypatch.setenv(PASSWORD_ENV, "s3cret-passphrase")
    assert invoke("sign", copy, "--key", locked, "--force").exit_code == 0
    library_verifies(copy, public)
    for path in copy.rglob("*.json"):
        assert "s3cret-passphrase" not in path.read_text()


def test_a_signed_s3_output_verifies_after_download(keys, tmp_path):
    private, public = keys["ours"]
    with moto_s3("signed") as (_, fs, _address):
        result = invoke(CANCER, *FAST, "--export", "savedmodel", "--sign-key", private, "--out", "s3://signed/cancer")
        assert result.exit_code == 0, result.output
        fs.invalidate_cache()
        assert "signed/cancer/model.sig" in fs.find("signed/cancer")
        fs.get("signed/cancer/", str(tmp_path / "downloaded"), recursive=True)
    code, found = verified(tmp_path / "downloaded", "--public-key", public, "--artifacts", "savedmodel")
    assert code == 0 and found["signature"]["passed"], found["checks"]
    library_verifies(tmp_path / "downloaded", public)


def test_a_signed_batch_signs_each_folder_and_its_root(keys, tmp_path):
    private, public = keys["ours"]
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    shutil.copy(CANCER, zoo / "cancer_mlp.keras")
    root = tmp_path / "root"
    result = invoke("batch", zoo, "--out", root, *FAST, "--export", "savedmodel", "--sign-key", private)
    assert result.exit_code == 0, result.output
    folder = root / "cancer_mlp" / "mixed_bfloat16"
    assert (
        json.loads((folder / "batch_result.json").read_text())["signed_by"]
        == json.loads((folder / "signing.json").read_text())["public_key_sha256"]
    )
    library_verifies(folder, public)
    library_verifies(root, public, "batch.sig")
    bundle = json.loads((root / "batch.sig").read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    assert {r["name"] for r in statement["predicate"]["resources"]} == {"batch.json", "index.html", "signing.json"}
    code, found = verified(root, "--public-key", public, "--artifacts", "savedmodel")
    assert code == 0 and found["signature"]["passed"] and found["models"][0]["verification"]["signature"]["passed"]
    (root / "index.html").write_text((root / "index.html").read_text().replace("passed", "PASSED!"))
    code, found = verified(root, "--public-key", public, "--artifacts", "savedmodel")
    assert code == 3 and found["signature"]["changed"] == ["index.html changed"]
    assert found["models"][0]["passed"]  # the model's own folder is still as signed
