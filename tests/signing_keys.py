"""Elliptic-curve key pairs for the signing tests, made with cryptography as a user would with openssl."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec


def key_pair(folder: Path, name: str, password: bytes | None = None, mode: int = 0o600) -> tuple[Path, Path]:
    """NAME.pem (P-256, PKCS#8, encrypted with `password` when given, chmod `mode`) and NAME.pub (PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    private, public = folder / f"{name}.pem", folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    os.chmod(private, mode)
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public
