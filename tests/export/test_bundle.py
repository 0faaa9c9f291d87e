"""Signed bundles: made, verified, and refused when unsigned, signed by another key, tampered,
truncated, with a file missing or added (also inside an added subdirectory or through a link); a
manifest that binds the model's name, card, weights and version; and bundle creation refusing an
export directory that is not the model's."""

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
    b = make_bundle(exp, tmp_path / "bundle", priv, "m", 96, 512, 0.9, card, version=7)
    return b, read_public_key(pub), tmp_path


def test_a_bundle_verifies_and_carries_its_specification(signed):
    b, pub, tmp = signed
    m = verify_bundle(b.directory, pub)
    assert set(m["files"]) == {"model.onnx", "model_int8.onnx", "MODEL_CARD.md"}
    assert m["input"]["shape"] == [1, 1, 96, 96] and "min-max" in m["input"]["preprocess"]["normalise"]
    assert m["embedding_dim"] == 512 and m["match_threshold"] == 0.9 and m["public_key"] == pub.hex()
    assert m["bundle_version"] == 7 and m["model"] == "m" and m["format_version"] == 2
    assert m["model_card"] == {"file": "MODEL_CARD.md", "sha256": m["files"]["MODEL_CARD.md"]["sha256"]}
    with tarfile.open(b.tar) as t:
        assert sorted(t.getnames()) == sorted(f"bundle/{n}" for n in [*m["files"], MANIFEST, SIGNATURE])
    assert oct((tmp / "keys" / "trn_signing_key.pem").stat().st_mode & 0o777) == "0o600"
    with pytest.raises(DataError, match="already"):
        keygen(tmp / "keys")


def test_keygen_out_a_file_is_named_as_a_file_not_a_directory(tmp_path, capsys):
    from trn.cli import export as export_cli

    f = tmp_path / "a_file"
    f.write_text("kept\n")
    want = "is a file, not a directory; --out takes the directory to write trn_signing_key.pem and trn_signing_key.pub"
    with pytest.raises(DataError, match=want) as e:
        keygen(f)
    assert e.value.path == str(f)
    with pytest.raises(DataError, match=f"{f} {want}") as e:  # a file on the way to --out
        keygen(f / "sub" / "keys")
    assert e.value.path == str(f / "sub" / "keys")
    assert export_cli.main(["keygen", "--out", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {f}: {want}") and "File exists" not in err
    assert f.read_text() == "kept\n" and sorted(tmp_path.iterdir()) == [f]


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


def test_an_added_subdirectory_or_link_is_refused_with_its_name(signed):
    b, pub, tmp = signed
    sub = b.directory / "extra"
    sub.mkdir()
    (sub / "payload.bin").write_bytes(b"x" * 100)
    with pytest.raises(DataError, match="plain files only.*directory"):
        verify_bundle(b.directory, pub)
    import shutil

    shutil.rmtree(sub)
    (b.directory / "evil.onnx").symlink_to(b.directory / "model.onnx")
    with pytest.raises(DataError, match="symbolic link"):
        verify_bundle(b.directory, pub)
    (b.directory / "evil.onnx").unlink()
    verify_bundle(b.directory, pub)


def test_missing_paths_files_and_tars_are_named_as_such(signed):
    b, pub, tmp = signed
    with pytest.raises(DataError, match="does not exist"):
        verify_bundle(tmp / "nowhere", pub)
    with pytest.raises(DataError, match=r"\.tar: pass the directory"):
        verify_bundle(b.tar, pub)
    with pytest.raises(DataError, match="no manifest.json"):
        verify_bundle(tmp / "keys", pub)
    for bad, why in [("zz", "neither a .pub file nor hexadecimal"), ("ab" * 31, "31 bytes"),
                     (str(tmp / "no.pub"), "no such public key file")]:
        with pytest.raises(DataError, match=why):
            read_public_key(bad)


def test_version_and_model_are_checked_and_signed(signed, tmp_path):
    b, pub, tmp = signed
    from trn.errors import ConfigError

    for bad in (0, -3, True, "7"):
        with pytest.raises(ConfigError, match="version"):
            make_bundle(tmp / "export", tmp / f"v{bad}", tmp / "keys" / "trn_signing_key.pem", "m", 96, 512, 0.9,
                        version=bad)
    derived = make_bundle(tmp / "export", tmp / "derived", tmp / "keys" / "trn_signing_key.pem", "m", 96, 512, 0.9)
    assert derived.manifest["bundle_version"] > 20_250_000_000_000  # YYYYMMDDHHMMSS of the signing time
    # a manifest without a version (the old format) is refused by the board's code, signed or not
    from trn.export.bundle import load_private_key

    m = json.loads((b.directory / MANIFEST).read_text())
    for field, value, why in [("bundle_version", None, "bundle_version"), ("format_version", 1, "format_version"),
                              ("model", "", "no model")]:
        bad = dict(m, **{field: value})
        data = (json.dumps(bad, indent=1, sort_keys=True) + "\n").encode()
        (b.directory / MANIFEST).write_bytes(data)
        (b.directory / SIGNATURE).write_bytes(load_private_key(tmp / "keys" / "trn_signing_key.pem").sign(data))
        with pytest.raises(DataError, match=why):
            verify_bundle(b.directory, pub)
    bad = dict(m, model_card={"file": "MODEL_CARD.md", "sha256": "0" * 64})  # a card other than the one bundled
    data = (json.dumps(bad, indent=1, sort_keys=True) + "\n").encode()
    (b.directory / MANIFEST).write_bytes(data)
    (b.directory / SIGNATURE).write_bytes(load_private_key(tmp / "keys" / "trn_signing_key.pem").sign(data))
    with pytest.raises(DataError, match="model card"):
        verify_bundle(b.directory, pub)


def _run_dir(tmp_path, name: str, seed: int):
    """A tiny model's run directory (weights, card)."""
    import torch

    from trn.models.checkpoint import CHECKPOINT_FORMAT, save_checked
    from trn.models.descriptor import create_model

    torch.manual_seed(seed)
    m = create_model("flight", input_size=32)
    (tmp_path / name).mkdir()
    save_checked({"format": CHECKPOINT_FORMAT, "version": 1, "model_config": m.cfg.to_dict(),
                  "model": m.state_dict()}, tmp_path / name / "weights.pt")
    (tmp_path / name / "MODEL_CARD.md").write_text(f"# {name}\n")
    return tmp_path / name


def _run_export_and_key(tmp_path):
    """A tiny model's run directory, its real ONNX export (trn-export onnx, report with the
    weights' sha256) and a key pair."""
    from trn.cli import export as export_cli

    _run_dir(tmp_path, "run", 0)
    assert export_cli.main(["onnx", "--model", str(tmp_path / "run"), "--out", str(tmp_path / "exp"),
                            "--no-parity", "--threads", "1"]) == 0
    assert export_cli.main(["keygen", "--out", str(tmp_path / "k")]) == 0
    return export_cli


def test_cli_keygen_bundle_verify(tmp_path, capsys):
    from trn.models.checkpoint import file_sha256

    export_cli = _run_export_and_key(tmp_path)
    rep = json.loads((tmp_path / "exp" / "onnx_report.json").read_text())
    assert rep["weights_sha256"] == file_sha256(tmp_path / "run" / "weights.pt")  # stamped at export time
    assert export_cli.main(["bundle", "--model", str(tmp_path / "run"), "--export", str(tmp_path / "exp"), "--key",
                            str(tmp_path / "k" / "trn_signing_key.pem"), "--out", str(tmp_path / "b"),
                            "--version", "4"]) == 0
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert m["model"] == "run" and m["bundle_version"] == 4 and m["source"]["weights_sha256"] == rep["weights_sha256"]
    assert m["model_card"]["sha256"] == m["files"]["MODEL_CARD.md"]["sha256"]
    assert export_cli.main(["verify", str(tmp_path / "b"), "--pub", str(tmp_path / "k" / "trn_signing_key.pub")]) == 0
    assert "OK" in capsys.readouterr().out
    (tmp_path / "b" / "model.onnx").write_bytes(b"tampered")
    assert export_cli.main(["verify", str(tmp_path / "b"), "--pub", str(tmp_path / "k" / "trn_signing_key.pub")]) == 2
    assert "model.onnx" in capsys.readouterr().err
    assert export_cli.main(["bundle", "--model", str(tmp_path / "run"), "--export", str(tmp_path / "exp"), "--key",
                            str(tmp_path / "k" / "trn_signing_key.pem"), "--out", str(tmp_path / "b")]) == 2
    assert "immutable" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        export_cli.main(["bundle", "--model", str(tmp_path / "run"), "--export", str(tmp_path / "exp"), "--key",
                         str(tmp_path / "k" / "trn_signing_key.pem"), "--out", str(tmp_path / "b0"), "--version", "0"])
    assert e.value.code == 2 and "--version: 0 is out of range" in capsys.readouterr().err
    pub = str(tmp_path / "k" / "trn_signing_key.pub")
    assert export_cli.main(["verify", str(tmp_path / "nowhere"), "--pub", pub]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_an_export_of_another_model_is_refused(tmp_path, capsys):
    """The audit's case: a model's name and card around another model's graphs."""
    export_cli = _run_export_and_key(tmp_path)
    _run_dir(tmp_path, "other", 1)
    key = str(tmp_path / "k" / "trn_signing_key.pem")

    def bundle(model: str, export, out: str) -> int:
        return export_cli.main(["bundle", "--model", model, "--export", str(export), "--key", key, "--out",
                                str(tmp_path / out)])

    assert bundle(str(tmp_path / "other"), tmp_path / "exp", "x1") == 2
    err = capsys.readouterr().err
    assert "another model's" in err and "model.onnx" in err and not (tmp_path / "x1").exists()
    # a graph changed after its report, or with no report at all
    import shutil

    shutil.copytree(tmp_path / "exp", tmp_path / "exp2")
    (tmp_path / "exp2" / "model.onnx").write_bytes((tmp_path / "exp2" / "model.onnx").read_bytes() + b"\0")
    assert bundle(str(tmp_path / "run"), tmp_path / "exp2", "x2") == 2
    assert "changed since onnx_report.json" in capsys.readouterr().err
    (tmp_path / "exp2" / "onnx_report.json").unlink()
    assert bundle(str(tmp_path / "run"), tmp_path / "exp2", "x3") == 2
    assert "no export report" in capsys.readouterr().err
    # no card beside the weights: nothing to bind
    (tmp_path / "run" / "MODEL_CARD.md").unlink()
    assert bundle(str(tmp_path / "run"), tmp_path / "exp", "x4") == 2
    assert "MODEL_CARD.md" in capsys.readouterr().err


def test_the_shipped_exports_are_cross_checked_against_the_shipped_models(tmp_path):
    """The audit's exact command: flight_ric_ca's name and card around conv2d-SE's export, refused;
    the right pair accepted; a head.npz of another model refused."""
    import shutil
    from pathlib import Path

    import numpy as np

    from trn.export.bundle import bundle_model, check_export

    repo = Path(__file__).resolve().parents[2]
    union = repo / "export" / "flight_conv2d_se_union"
    if not (union / "model_int8.tflite").is_file() or not (repo / "models" / "flight_ric_ca" / "weights.pt").is_file():
        pytest.skip("the shipped export or models are absent")
    priv, _ = keygen(tmp_path / "keys")
    with pytest.raises(DataError, match="not from flight_ric_ca"):
        bundle_model("flight_ric_ca", union, tmp_path / "ric", priv, version=1)
    assert not (tmp_path / "ric").exists()
    b = bundle_model("flight_conv2d_se_union", union, tmp_path / "union", priv, version=1)
    graphs = {n for n in ("model.onnx", "model_int8.onnx") if (union / n).is_file()}  # the ONNX graphs are not in git
    assert set(b.manifest["source"]["checked"]) == graphs | {"model_int8.tflite", "head.npz"}
    # the right reports and graphs, but another model's head
    exp = tmp_path / "exp"
    shutil.copytree(union, exp)
    from trn.export.graph import ExportGraph
    from trn.export.tflite import head_of
    from trn.models.checkpoint import load_descriptor

    head_of(ExportGraph(load_descriptor(repo / "models" / "flight_conv2d_se" / "weights.pt"))).save(exp / "head.npz")
    with pytest.raises(DataError, match="head.npz is not flight_conv2d_se_union's head"):
        check_export(exp, repo / "models" / "flight_conv2d_se_union" / "weights.pt", "flight_conv2d_se_union")
    # an Edge TPU-compiled file must carry the int8 file's quantisation
    shutil.copy(union / "head.npz", exp / "head.npz")
    shutil.copy(exp / "model_int8.tflite", exp / "model_int8_edgetpu.tflite")
    got = check_export(exp, repo / "models" / "flight_conv2d_se_union" / "weights.pt", "flight_conv2d_se_union")
    assert "model_int8_edgetpu.tflite" in got["checked"]
    from tests.export.test_onnx import trained_looking
    from trn.export.tflite import export_tflite

    export_tflite(trained_looking("conv2d", "se", 0), tmp_path / "tiny",
                  np.random.default_rng(0).random((4, 32, 32)).astype(np.float32), "random", float_model=False)
    shutil.copy(tmp_path / "tiny" / "model_int8.tflite", exp / "model_int8_edgetpu.tflite")
    with pytest.raises(DataError, match="not compiled from this export"):
        check_export(exp, repo / "models" / "flight_conv2d_se_union" / "weights.pt", "flight_conv2d_se_union")


def test_the_threshold_travels_from_the_model_card_into_the_bundle(tmp_path):
    import json

    from trn.errors import DataError
    from trn.models.operating_point import OperatingPoint, model_threshold

    export_cli = _run_export_and_key(tmp_path)
    key = str(tmp_path / "k" / "trn_signing_key.pem")

    def manifest_threshold(out: str, *extra: str) -> float:
        assert export_cli.main(["bundle", "--model", str(tmp_path / "run"), "--export", str(tmp_path / "exp"),
                                "--key", key, "--out", str(tmp_path / out), "--version", "1", *extra]) == 0
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


def _resign(b, tmp, **fields):
    """The bundle's manifest with ``fields`` changed, signed by the trusted key itself."""
    from trn.export.bundle import load_private_key

    m = dict(json.loads((b.directory / MANIFEST).read_text()), **fields)
    data = (json.dumps(m, indent=1, sort_keys=True) + "\n").encode()
    (b.directory / MANIFEST).write_bytes(data)
    (b.directory / SIGNATURE).write_bytes(load_private_key(tmp / "keys" / "trn_signing_key.pem").sign(data))


@pytest.mark.parametrize("fields, why", [
    ({"model": "../../x"}, "not a plain name"),
    ({"model": "/etc/passwd"}, "not a plain name"),
    ({"model": ".hidden"}, "not a plain name"),
    ({"model": "a/b"}, "not a plain name"),
    ({"model": "x" * 129}, "not a plain name"),
    ({"tflite": {"file": "../../model.onnx", "head": "model.onnx"}}, "tflite.file"),
    ({"detector": {"file": "/dev/zero"}}, "detector.file"),
    ({"map": {"index": "model.onnx", "craters_file": "../craters.npz"}}, "map.craters_file"),
    ({"map": "model.onnx"}, "map"),
])
def test_names_in_a_signed_manifest_are_data_never_paths(signed, fields, why):
    """A manifest signed by the trusted key itself naming its model `../../x` was accepted by
    verify; so would a file name in its TFLite, detector or map section that the agent opens."""
    b, pub, tmp = signed
    _resign(b, tmp, **fields)
    with pytest.raises(DataError, match=why):
        verify_bundle(b.directory, pub)


def test_a_model_name_that_is_a_path_is_refused_when_making_the_bundle(signed):
    b, pub, tmp = signed
    from trn.errors import ConfigError

    for name in ("../../x", "a/b", ".m", "-m"):
        with pytest.raises(ConfigError, match="not a plain name"):
            make_bundle(tmp / "export", tmp / f"n{len(name)}", tmp / "keys" / "trn_signing_key.pem", name, 96, 512, 0.9,
                        version=8)
    ok = make_bundle(tmp / "export", tmp / "ok", tmp / "keys" / "trn_signing_key.pem", "flight_conv2d_se_union@tflite",
                     96, 512, 0.9, version=8)
    assert verify_bundle(ok.directory, pub)["model"] == "flight_conv2d_se_union@tflite"


def test_a_version_above_2_53_minus_1_is_refused_when_making_and_when_verifying(signed, capsys):
    """`--version 1180591620717411303424` was signed, and a board that accepted it refused every
    ordinary bundle from then on. Versions run from 1 to 2**53 - 1, on the ground and on the board."""
    b, pub, tmp = signed
    from trn.cli.export import main as export_cli
    from trn.errors import ConfigError
    from trn_board.bundle import MAX_BUNDLE_VERSION

    assert MAX_BUNDLE_VERSION == 2**53 - 1 == 9007199254740991
    key = tmp / "keys" / "trn_signing_key.pem"
    for v in (2**53, 1180591620717411303424):
        with pytest.raises(ConfigError, match=r"above 9007199254740991 \(2\*\*53 - 1\), the largest a board accepts"):
            make_bundle(tmp / "export", tmp / f"v{v}", key, "m", 96, 512, 0.9, version=v)
        with pytest.raises(SystemExit) as e:
            export_cli(["bundle", "--model", "m", "--export", str(tmp / "export"), "--key", str(key), "--out",
                        str(tmp / "cli"), "--version", str(v)])
        assert e.value.code == 2 and "argument --version: bundle_version" in capsys.readouterr().err
        _resign(b, tmp, bundle_version=v)
        with pytest.raises(DataError, match="above 9007199254740991"):
            verify_bundle(b.directory, pub)
    top = make_bundle(tmp / "export", tmp / "top", key, "m", 96, 512, 0.9, version=MAX_BUNDLE_VERSION)
    assert verify_bundle(top.directory, pub)["bundle_version"] == MAX_BUNDLE_VERSION


def test_a_signed_manifest_nested_too_deep_is_refused(signed):
    """Python's json reads nesting by recursion: a manifest of 100,000 nested brackets, signed by
    the trusted key, ended in a RecursionError on the ground and on the board."""
    b, pub, tmp = signed
    from trn.export.bundle import load_private_key

    data = ("[" * 100_000 + "]" * 100_000).encode()
    (b.directory / MANIFEST).write_bytes(data)
    (b.directory / SIGNATURE).write_bytes(load_private_key(tmp / "keys" / "trn_signing_key.pem").sign(data))
    with pytest.raises(DataError, match="manifest is nested too deep to read"):
        verify_bundle(b.directory, pub)


def test_cli_bundles_a_descriptor_pair_each_export_checked_against_its_own_model(tmp_path, capsys):
    export_cli = _run_export_and_key(tmp_path)  # "run": the frame descriptor, exported to exp
    _run_dir(tmp_path, "lm", 1)
    assert export_cli.main(["onnx", "--model", str(tmp_path / "lm"), "--out", str(tmp_path / "lm_exp"),
                            "--no-parity", "--threads", "1"]) == 0
    (tmp_path / "pair").mkdir()
    (tmp_path / "pair" / "pair.json").write_text(json.dumps({"frames": "../run", "landmarks": "../lm"}))
    key = str(tmp_path / "k" / "trn_signing_key.pem")

    def bundle(out: str, *extra: str) -> int:
        return export_cli.main(["bundle", "--model", str(tmp_path / "pair"), "--key", key, "--out", str(tmp_path / out),
                                "--version", "3", *extra])

    assert bundle("b", "--export", str(tmp_path / "exp"), "--landmark-export", str(tmp_path / "lm_exp")) == 0
    out = capsys.readouterr().out
    assert "pair pair: frames run, landmarks lm" in out
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert m["format_version"] == 3 and m["model"] == "run" and m["landmarks"]["model"] == "lm"
    assert m["landmarks"]["files"]["model.onnx"] == "landmarks_model.onnx"
    assert m["landmarks"]["model_card"]["sha256"] == m["files"]["landmarks_MODEL_CARD.md"]["sha256"]
    assert export_cli.main(["verify", str(tmp_path / "b"), "--pub", str(tmp_path / "k" / "trn_signing_key.pub")]) == 0
    # the exports swapped: each is checked against its own member's weights
    assert bundle("x1", "--export", str(tmp_path / "lm_exp"), "--landmark-export", str(tmp_path / "exp")) == 2
    assert "another model's" in capsys.readouterr().err and not (tmp_path / "x1").exists()
    # a pair without its landmark export, a single model with one
    assert bundle("x2", "--export", str(tmp_path / "exp")) == 2
    assert "is a descriptor pair" in capsys.readouterr().err
    assert export_cli.main(["bundle", "--model", str(tmp_path / "run"), "--export", str(tmp_path / "exp"),
                            "--landmark-export", str(tmp_path / "lm_exp"), "--key", key, "--out",
                            str(tmp_path / "x3")]) == 2
    assert "is for a descriptor pair" in capsys.readouterr().err


def test_a_detector_export_report_nested_too_deep_is_named_not_a_recursion_error(tmp_path, capsys):
    """An export_report.json nested 100,000 deep (an audit's file) is refused naming the file, by
    the bundle's reader and by ``trn-export bundle --detector``, before anything is written."""
    from trn.export.bundle import DETECTOR_FILE, detector_spec

    det = tmp_path / "det"
    det.mkdir()
    (det / DETECTOR_FILE).write_bytes(b"TFL3" * 8)
    (det / "export_report.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataError, match=r"export_report.json: .*nested too deep"):
        detector_spec(det)
    export_cli = _run_export_and_key(tmp_path)
    rc = export_cli.main(["bundle", "--model", str(tmp_path / "run"), "--export", str(tmp_path / "exp"), "--key",
                          str(tmp_path / "k" / "trn_signing_key.pem"), "--out", str(tmp_path / "b"),
                          "--detector", str(det)])
    err = capsys.readouterr().err
    assert rc == 2 and "nested too deep" in err and "Traceback" not in err and not (tmp_path / "b").exists()
