"""Signed bundles: made, verified, and refused when unsigned, signed by another key, tampered,
truncated, or with a file missing or added."""

import json
import os
import tarfile

import pytest

from trn.errors import DataError

pytest.importorskip("cryptography")

from trn.export.bundle import MANIFEST, SIGNATURE, keygen, make_bundle, read_public_key, verify_bundle  # noqa: E402


@pytest.fixture
def signed(tmp_path):
    exp = tmp_path / "export"
    exp.mkdir()
    (exp / "model.onnx").write_bytes(os.urandom(3000))
    (exp / "model_int8.onnx").write_bytes(os.urandom(1500))
    card = tmp_path / "MODEL_CARD.md"
    card.write_text("# card\n")
    priv, pub = keygen(tmp_path / "keys")
    b = make_bundle(exp, tmp_path / "bundle", priv, "m", 96, 512, 0.9, card)
    return b, read_public_key(pub), tmp_path


def test_a_bundle_verifies_and_carries_its_specification(signed):
    b, pub, tmp = signed
    m = verify_bundle(b.directory, pub)
    assert set(m["files"]) == {"model.onnx", "model_int8.onnx", "MODEL_CARD.md"}
    assert m["input"]["shape"] == [1, 1, 96, 96] and "min-max" in m["input"]["preprocess"]["normalise"]
    assert m["embedding_dim"] == 512 and m["match_threshold"] == 0.9 and m["public_key"] == pub.hex()
    with tarfile.open(b.tar) as t:
        assert sorted(t.getnames()) == sorted(f"bundle/{n}" for n in [*m["files"], MANIFEST, SIGNATURE])
    assert oct((tmp / "keys" / "trn_signing_key.pem").stat().st_mode & 0o777) == "0o600"
    with pytest.raises(DataError, match="already"):
        keygen(tmp / "keys")


@pytest.mark.parametrize("name", ["model.onnx", "model_int8.onnx", "MODEL_CARD.md", MANIFEST, SIGNATURE])
def test_one_flipped_byte_anywhere_is_refused(signed, name):
    b, pub, _ = signed
    f = b.directory / name
    data = bytearray(f.read_bytes())
    for pos in (0, len(data) // 2, len(data) - 1):
        flipped = bytearray(data)
        flipped[pos] ^= 0x01
        f.write_bytes(bytes(flipped))
        with pytest.raises(DataError, match="sha256|signature"):
            verify_bundle(b.directory, pub)
    f.write_bytes(bytes(data))
    verify_bundle(b.directory, pub)


def test_wrong_key_unsigned_truncated_missing_and_added_files_are_refused(signed):
    b, pub, tmp = signed
    _, other = keygen(tmp / "other")
    with pytest.raises(DataError, match="another key"):
        verify_bundle(b.directory, read_public_key(other))
    f = b.directory / "model.onnx"
    data = f.read_bytes()
    f.write_bytes(data[:-10])
    with pytest.raises(DataError, match="truncated"):
        verify_bundle(b.directory, pub)
    f.unlink()
    with pytest.raises(DataError, match="missing"):
        verify_bundle(b.directory, pub)
    f.write_bytes(data)
    (b.directory / "extra.bin").write_bytes(b"x")
    with pytest.raises(DataError, match="not in the manifest"):
        verify_bundle(b.directory, pub)
    (b.directory / "extra.bin").unlink()
    sig = (b.directory / SIGNATURE).read_bytes()
    (b.directory / SIGNATURE).unlink()
    with pytest.raises(DataError, match="not signed"):
        verify_bundle(b.directory, pub)
    (b.directory / SIGNATURE).write_bytes(sig)
    verify_bundle(b.directory, pub)
    with pytest.raises(DataError, match="hex"):
        read_public_key("zz")


def test_a_resigned_manifest_by_another_key_is_refused(signed):
    b, pub, tmp = signed
    from trn.export.bundle import load_private_key

    m = json.loads((b.directory / MANIFEST).read_text())
    m["match_threshold"] = 0.5  # an attacker edits the manifest and signs it with their own key
    data = (json.dumps(m, indent=1, sort_keys=True) + "\n").encode()
    priv, _ = keygen(tmp / "attacker")
    (b.directory / MANIFEST).write_bytes(data)
    (b.directory / SIGNATURE).write_bytes(load_private_key(priv).sign(data))
    with pytest.raises(DataError, match="another key"):
        verify_bundle(b.directory, pub)


def _run_export_and_key(tmp_path):
    """A tiny model's run directory, an export directory holding one file, and a key pair."""
    import torch

    from trn.cli import export as export_cli
    from trn.models.checkpoint import CHECKPOINT_FORMAT, save_checked
    from trn.models.descriptor import create_model

    m = create_model("flight", input_size=32)
    (tmp_path / "run").mkdir()
    save_checked({"format": CHECKPOINT_FORMAT, "version": 1, "model_config": m.cfg.to_dict(),
                  "model": m.state_dict()}, tmp_path / "run" / "weights.pt")
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "model.onnx").write_bytes(torch.zeros(10).numpy().tobytes())
    assert export_cli.main(["keygen", "--out", str(tmp_path / "k")]) == 0
    return export_cli


def test_cli_keygen_bundle_verify(tmp_path, capsys):
    export_cli = _run_export_and_key(tmp_path)
    assert export_cli.main(["bundle", "--model", str(tmp_path / "run"), "--export", str(tmp_path / "exp"), "--key",
                            str(tmp_path / "k" / "trn_signing_key.pem"), "--out", str(tmp_path / "b")]) == 0
    assert export_cli.main(["verify", str(tmp_path / "b"), "--pub", str(tmp_path / "k" / "trn_signing_key.pub")]) == 0
    assert "OK" in capsys.readouterr().out
    (tmp_path / "b" / "model.onnx").write_bytes(b"tampered")
    assert export_cli.main(["verify", str(tmp_path / "b"), "--pub", str(tmp_path / "k" / "trn_signing_key.pub")]) == 2
    assert "model.onnx" in capsys.readouterr().err
    assert export_cli.main(["bundle", "--model", str(tmp_path / "run"), "--export", str(tmp_path / "exp"), "--key",
                            str(tmp_path / "k" / "trn_signing_key.pem"), "--out", str(tmp_path / "b")]) == 2
    assert "immutable" in capsys.readouterr().err


def test_the_threshold_travels_from_the_model_card_into_the_bundle(tmp_path):
    import json

    from trn.errors import DataError
    from trn.models.operating_point import OperatingPoint, model_threshold

    export_cli = _run_export_and_key(tmp_path)
    key = str(tmp_path / "k" / "trn_signing_key.pem")

    def manifest_threshold(out: str, *extra: str) -> float:
        assert export_cli.main(["bundle", "--model", str(tmp_path / "run"), "--export", str(tmp_path / "exp"),
                                "--key", key, "--out", str(tmp_path / out), *extra]) == 0
        return json.loads((tmp_path / out / "manifest.json").read_text())["match_threshold"]

    assert model_threshold(tmp_path / "run") == 0.9
    assert manifest_threshold("b0") == 0.9  # no operating point: the paper's threshold
    OperatingPoint(0.875, "validation orbit data/luna1-val, Moon Navigation RA").write(tmp_path / "run")
    assert manifest_threshold("b1") == 0.875  # the model's, chosen on validation data
    assert manifest_threshold("b2", "--threshold", "0.95") == 0.95  # an explicit choice wins
    (tmp_path / "run" / "operating_point.json").write_text('{"match_threshold": 7, "chosen_on": "x"}')
    with pytest.raises(DataError, match="not a cosine"):
        model_threshold(tmp_path / "run")
    (tmp_path / "run" / "operating_point.json").write_text('{"match_threshold": 0.8, "chosen_on": " "}')
    with pytest.raises(DataError, match="chosen_on"):
        model_threshold(tmp_path / "run")
