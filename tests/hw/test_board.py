"""The board-side package: pure-Python Ed25519 against RFC 8032 and against the signer, and
bundle verification without torch or trn."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trn_board.ed25519 import verify

REPO = Path(__file__).resolve().parents[2]

# RFC 8032, section 7.1, TEST 1 (empty message) and TEST 2 (one byte)
RFC = [
    ("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
     "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"),
    ("3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
     "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"),
]


@pytest.mark.parametrize("pub,msg,sig", RFC)
def test_rfc8032_vectors(pub, msg, sig):
    pub, msg, sig = bytes.fromhex(pub), bytes.fromhex(msg), bytes.fromhex(sig)
    assert verify(pub, msg, sig)
    assert not verify(pub, msg + b"\0", sig)
    bad = bytearray(sig)
    bad[40] ^= 0x10
    assert not verify(pub, msg, bytes(bad))
    # S >= L (a malleated signature) and malformed inputs are refused, not crashed on
    s_plus_l = (int.from_bytes(sig[32:], "little") + 2 ** 252 + 27742317777372353535851937790883648493).to_bytes(32, "little")
    assert not verify(pub, msg, sig[:32] + s_plus_l)
    assert not verify(pub[:31], msg, sig) and not verify(pub, msg, sig[:63]) and not verify(b"\xff" * 32, msg, sig)


def test_agrees_with_the_signer_on_random_keys_and_messages():
    pytest.importorskip("cryptography")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    for n in range(20):
        k = Ed25519PrivateKey.generate()
        pub = k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        msg = os.urandom(n * 13)
        sig = k.sign(msg)
        other = Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                       serialization.PublicFormat.Raw)
        assert verify(pub, msg, sig) and not verify(other, msg, sig)


def test_the_board_package_imports_neither_torch_nor_trn(tmp_path):
    code = ("import sys, trn_board.bundle, trn_board.ed25519, trn_board.trust, trn_board.install, trn_board.agent; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'trn', 'cryptography')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    env = {**os.environ, "PYTHONPATH": str(REPO / "hw" / "agent")}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
