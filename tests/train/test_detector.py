"""The detector's training pieces and its whole path on a tiny world: build frames, train, resume,
ship, evaluate, run on a folder, and the navigation scenarios on its boxes."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from trn.cli.detect import main as detect_main
from trn.data.datasets.annotate import AnnotateConfig
from trn.data.datasets.build import BuildConfig, build_luna1
from trn.data.datasets.detection import DetectionBuildConfig, build_detection_set, label_build
from trn.data.datasets.labels import read_labels
from trn.data.worlds.render import RenderConfig
from trn.detect.model import CraterDetector, DetectorConfig, load_detector
from trn.train.detector import DetectTrainConfig, augment, focal_loss, train_detector
from trn.errors import ConfigError

SMALL = RenderConfig(nav_size=64, crater_size=32)
RULE = AnnotateConfig(min_box_px=3)


def test_augmented_boxes_still_frame_their_squares():
    img = np.full((128, 128), 40, np.uint8)
    boxes = np.array([[10, 30, 60, 90], [70, 110, 20, 40]], np.float32)
    for l, r, t, b in boxes.astype(int):
        img[t:b, l:r] = 220
    rng = np.random.default_rng(1)
    for _ in range(20):
        x, bx = augment(img, boxes, 96, 4, rng)
        for l, r, t, b in bx:
            inside = x[int(t) + 2:int(b) - 2, int(l) + 2:int(r) - 2]
            if inside.size:
                assert inside.mean() > x.mean(), "a transformed box no longer covers its bright square"


def test_flags_follow_their_boxes_through_crops_and_turns():
    img = np.random.default_rng(0).integers(0, 255, (128, 128)).astype(np.uint8)
    boxes = np.array([[10, 30, 60, 90], [70, 110, 20, 40], [40, 60, 100, 120], [90, 120, 90, 126]], np.float32)
    flags = np.array([False, True, False, True])
    kept_any = 0
    for seed in range(30):
        x, bx, fl = augment(img, boxes, 96, 4, np.random.default_rng(seed), flags)
        # the same draw on the unflagged boxes alone gives exactly the boxes flagged False
        x2, bx2 = augment(img, boxes[~flags], 96, 4, np.random.default_rng(seed))
        assert len(fl) == len(bx) and np.array_equal(x, x2)
        assert np.array_equal(bx[~fl], bx2)
        kept_any += int(fl.sum())
    assert kept_any > 10


def test_an_ignored_box_has_no_peak_and_no_loss_inside():
    from trn.train.detector import targets

    boxes = np.array([[8, 40, 8, 40], [64, 96, 64, 96]], np.float32)
    heat, size, off, mask, weight = targets(boxes, 32, np.array([False, True]))
    assert mask.sum() == 1 and heat[6, 6] == 1.0 and heat[20, 20] < 1e-3  # only the first box's peak
    assert weight[16:24, 16:24].sum() == 0 and weight[:16, :16].min() == 1.0 and weight.sum() == 32 * 32 - 64
    h2, s2, o2, m2 = targets(boxes[:1], 32)
    assert np.array_equal(h2, heat) and np.array_equal(m2, mask)  # the same as if the box were not there
    logits = torch.zeros(1, 32, 32)
    w = torch.from_numpy(weight)[None]
    with_w = focal_loss(logits, torch.from_numpy(heat)[None], w)
    assert with_w < focal_loss(logits, torch.from_numpy(heat)[None])


def test_ignoring_by_relief_needs_a_source_per_directory():
    with pytest.raises(ConfigError, match="one elevation source per data directory"):
        DetectTrainConfig(data=("a", "b"), sources=("s",), ignore_relief_below=0.02)
    with pytest.raises(ConfigError, match="ignore_relief_below"):
        DetectTrainConfig(data=("a",), ignore_relief_below=1.5)
    with pytest.raises(ConfigError, match="sources"):
        DetectTrainConfig.from_dict({"data": ["a"], "sources": "s"})
    cfg = DetectTrainConfig.from_dict({"data": ["a"], "sources": ["s"], "ignore_relief_below": 0.02})
    assert cfg.sources == ("s",) and DetectTrainConfig.from_dict(cfg.to_dict()) == cfg


def test_invisible_labels_are_ignored_by_the_test_sequences_rule():
    from trn.data.datasets.detection import RELIEF_VISIBLE_CONTRAST
    from trn.data.datasets.labels import LabelledBox, LabelledFrame
    from trn.train.detector import ignored_boxes

    # relief 0.02 under a Sun of 40 deg: contrast 4 * 0.02 / tan 40 = 0.095, below the 0.10 rule;
    # 0.03 at 40 deg: 0.143, kept; 0.002 under a Sun of 3 deg: 0.153, kept (low Sun shows any relief)
    boxes = tuple(LabelledBox(i, (0, 10, 0, 10), 5.0, sun, False) for i, sun in ((1, 40.0), (2, 40.0), (3, 3.0)))
    f = LabelledFrame(0, "train", 1, 100.0, 40.0, 0.0, 0.0, boxes)
    relief = {1: 0.02, 2: 0.03, 3: 0.002}
    assert RELIEF_VISIBLE_CONTRAST == 0.10
    assert ignored_boxes(f, relief, invisible=True).tolist() == [True, False, False]
    assert ignored_boxes(f, relief, below=0.025).tolist() == [True, False, True]
    assert ignored_boxes(f, relief, below=0.025, invisible=True).tolist() == [True, False, True]
    assert ignored_boxes(f, None, invisible=True).tolist() == [False, False, False]  # a real image: all kept
    with pytest.raises(ConfigError, match="ignore_invisible needs one elevation source per data directory"):
        DetectTrainConfig(data=("a", "b"), sources=("s",), ignore_invisible=True)
    cfg = DetectTrainConfig.from_dict({"data": ["a", "b"], "sources": ["none", "s"], "ignore_invisible": True})
    assert DetectTrainConfig.from_dict(cfg.to_dict()) == cfg


def test_validation_under_the_rule_counts_only_the_kept_labels():
    from trn.data.datasets.labels import LabelledBox, LabelledFrame
    from trn.train.detector import FrameSet, evaluate_set

    boxes = tuple(LabelledBox(i, (8 + 40 * i, 40 + 40 * i, 8, 40), 5.0, 30.0, False) for i in range(3))
    f = LabelledFrame(0, "val", 1, 100.0, 30.0, 0.0, 0.0, boxes)
    def frames(flags):
        return FrameSet(np.full((1, 128, 128), 90, np.uint8), [np.array([b.box for b in boxes], np.float32)], [f],
                        [(128, 128)], np.array([True]), [np.array(flags)])

    model = CraterDetector(DetectorConfig(input_size=128)).eval()
    assert evaluate_set(model, frames([False, False, False]))[0].gt_hit.size == 3
    assert evaluate_set(model, frames([False, True, False]))[0].gt_hit.size == 2


def test_focal_loss_ignores_negatives_where_told():
    heat = torch.zeros(2, 4, 4)
    heat[:, 1, 1] = 1.0
    logits = torch.zeros(2, 4, 4)
    full = focal_loss(logits, heat)
    pos_only = focal_loss(logits, heat, torch.zeros(2))
    half = focal_loss(logits, heat, torch.tensor([1.0, 0.0]))
    assert pos_only < half < full
    assert float(full - half) == pytest.approx(float(half - pos_only))


@pytest.fixture(scope="module")
def det_run(boxed_world, tmp_path_factory):
    root = tmp_path_factory.mktemp("det")
    labels = build_detection_set(DetectionBuildConfig(source=boxed_world, out=root / "data", segments=4, val_segments=1,
                                                      stride=2, min_sun_elevation_deg=-90, workers=1, render=SMALL,
                                                      annotate=RULE))
    cfg = DetectTrainConfig(data=(str(root / "data"),), model=DetectorConfig(input_size=64, widths=(4, 8, 8, 8, 8),
                                                                            neck=8), epochs=2, batch_size=4, crop=64,
                            threads=1)
    history = train_detector(cfg, root / "run", stop_after=1)
    return root, labels, cfg, history


def test_detector_data_are_labelled_and_split(det_run):
    _, labels, _, _ = det_run
    assert labels.split("train") and all(f.segment < 3 for f in labels.split("train"))
    assert labels.split("val") and all(f.segment == 3 for f in labels.split("val"))
    assert any(f.boxes for f in labels.frames)


def test_training_resumes_on_other_threads_and_refuses_other_settings(det_run):
    root, _, cfg, history = det_run
    assert len(history) == 1 and 0.0 <= history[0]["val_ap50"] <= 1.0
    with pytest.raises(ConfigError, match="already holds a run"):
        train_detector(cfg, root / "run")
    with pytest.raises(ConfigError, match="other settings"):
        train_detector(DetectTrainConfig(**{**cfg.__dict__, "lr": 1e-3}), root / "run", resume=True)
    assert len(train_detector(DetectTrainConfig(**{**cfg.__dict__, "threads": 2}), root / "run", resume=True)) == 2
    # the starting weights named at another path (a fresh checkout's copy) do not stop a resume
    shutil.copy(root / "run" / "best.pt", root / "elsewhere.pt")
    moved = DetectTrainConfig(**{**cfg.__dict__, "init": str(root / "elsewhere.pt")})
    assert len(train_detector(moved, root / "run", resume=True)) == 2
    model, meta = load_detector(root / "run" / "best.pt")
    assert isinstance(model, CraterDetector) and meta["epoch"] in (1, 2)
    # a fine-tune resumed on a fresh machine: the init its state records no longer exists there
    for ext in ("", ".sha256"):
        shutil.copy(root / "run" / f"best.pt{ext}", root / f"gone.pt{ext}")
    tuned = DetectTrainConfig(**{**cfg.__dict__, "init": str(root / "gone.pt"), "epochs": 2})
    train_detector(tuned, root / "tuned-away", stop_after=1)
    (root / "gone.pt").unlink()
    again = DetectTrainConfig(**{**tuned.__dict__, "init": str(root / "elsewhere.pt")})
    assert len(train_detector(again, root / "tuned-away", resume=True)) == 2


def test_fine_tuning_starts_from_the_given_weights_and_refuses_another_architecture(det_run):
    root, _, cfg, _ = det_run
    init = root / "run" / "best.pt"
    start = torch.load(init, weights_only=False)["model"]
    tuned = DetectTrainConfig(**{**cfg.__dict__, "init": str(init), "lr": 1e-9, "epochs": 1, "warmup_epochs": 0})
    train_detector(tuned, root / "tuned")
    after = torch.load(root / "tuned" / "last.pt", weights_only=False)["model"]
    convs = [k for k in start if k.endswith("weight") and start[k].dim() == 4]
    assert convs and all(torch.allclose(after[k], start[k], atol=1e-6) for k in convs)
    scratch = DetectTrainConfig(**{**tuned.__dict__, "init": ""})
    train_detector(scratch, root / "scratch")
    fresh = torch.load(root / "scratch" / "last.pt", weights_only=False)["model"]
    assert not all(torch.allclose(fresh[k], start[k], atol=1e-3) for k in convs)
    with pytest.raises(ConfigError, match="architecture"):
        other = DetectorConfig(**{**cfg.model.__dict__, "neck": 12})
        train_detector(DetectTrainConfig(**{**tuned.__dict__, "model": other}), root / "other")
    with pytest.raises(ConfigError, match="no such detector checkpoint"):
        DetectTrainConfig(**{**tuned.__dict__, "init": str(root / "missing.pt")})


def test_ship_eval_and_run_commands(det_run, capsys):
    root, labels, _, _ = det_run
    assert detect_main(["ship", str(root / "run"), "--out", str(root / "model"), "--gate-km", "0"]) == 0
    assert (root / "model" / "detector.pt").is_file() and (root / "model" / "MODEL_CARD.md").is_file()
    assert detect_main(["eval", str(root / "model"), "--data", str(root / "data"), "--json", str(root / "e.json")]) == 0
    rep = json.loads((root / "e.json").read_text())
    assert rep["split"] == "val" and rep["summary"]["labels"] == sum(len(f.boxes) for f in labels.split("val"))
    assert detect_main(["run", str(root / "model"), str(labels.image_path(labels.frames[0].frame).parent),
                        "--out", str(root / "out"), "--threshold", "0.01"]) == 0
    doc = json.loads((root / "out" / "detections.json").read_text())
    assert len(doc["images"]) == len(labels.frames) and (root / "out" / "annotations.txt").is_file()
    assert len(list((root / "out" / "overlays").glob("*.png"))) == len(labels.frames)


def test_eval_pools_several_builds_and_refuses_one_named_twice(det_run, capsys):
    root, labels, _, _ = det_run
    shipped = Path(__file__).resolve().parents[2] / "models" / "detector"
    twin = root / "data-twin"
    if not twin.is_dir():
        shutil.copytree(root / "data", twin)
    base = ["eval", str(shipped), "--gate-km", "0", "--threshold", "0.2"]
    assert detect_main(base + ["--data", str(root / "data"), "--json", str(root / "single.json")]) == 0
    capsys.readouterr()
    assert detect_main(base + ["--data", str(root / "data"), str(twin), "--json", str(root / "pooled.json")]) == 0
    assert "pooled over 2 builds" in capsys.readouterr().out
    one, both = (json.loads((root / n).read_text()) for n in ("single.json", "pooled.json"))
    s, p = one["summary"], both["pooled"]
    assert [b["data"] for b in both["builds"]] == [str(root / "data"), str(twin)]
    assert (p["labels"], p["detections"], p["hits"]) == (2 * s["labels"], 2 * s["detections"], 2 * s["hits"])
    assert (p["precision"], p["recall"]) == (s["precision"], s["recall"]) and both["frames"] == 2 * one["frames"]
    capsys.readouterr()
    assert detect_main(base + ["--data", str(twin), str(twin)]) == 2
    assert "names a build twice" in capsys.readouterr().err


def test_eval_and_run_at_several_scales_say_which_and_one_whole_band_is_the_frame_path(det_run, capsys):
    root, labels, _, _ = det_run
    if not (root / "model" / "detector.pt").is_file():
        assert detect_main(["ship", str(root / "run"), "--out", str(root / "model"), "--gate-km", "0"]) == 0
    # the shipped detector: the tiny one trained here scores every box under the evaluation's floor
    shipped = Path(__file__).resolve().parents[2] / "models" / "detector"
    base = ["eval", str(shipped), "--data", str(root / "data"), "--gate-km", "0", "--threshold", "0.2"]
    assert detect_main(base + ["--json", str(root / "plain.json")]) == 0
    side = labels.load(labels.split("val")[0].frame).shape[1]
    one = f"{256 / side:g}"                                   # the frame whole in one tile, as the frame path has it
    assert detect_main(base + ["--scales", one, "--bands", "0-inf", "--json", str(root / "one.json")]) == 0
    plain, whole = (json.loads((root / n).read_text()) for n in ("plain.json", "one.json"))
    # AP takes every box down to 0.01, where the frame path decodes 100 peaks and the tiler 256
    at = {k: v for k, v in plain["summary"].items() if k != "ap50"}
    assert at == {k: v for k, v in whole["summary"].items() if k != "ap50"} and at["detections"] > 0
    assert whole["scales"][0]["factor"] == float(one)
    capsys.readouterr()
    assert detect_main(base + ["--scales", f"{one},{float(one) / 2:g}", "--json", str(root / "two.json")]) == 0
    assert "each frame tiled at scales " in capsys.readouterr().out
    assert len(json.loads((root / "two.json").read_text())["scales"]) == 2
    frames = labels.image_path(labels.frames[0].frame).parent
    assert detect_main(["run", str(root / "model"), str(frames), "--out", str(root / "ms"), "--threshold", "0.01",
                        "--scales", "1,0.5", "--bands", "0-30,30-inf"]) == 0
    out = capsys.readouterr().out
    assert "scales 1 (boxes of 0-30 image px), 0.5 (boxes of 30-inf image px)" in out
    doc = json.loads((root / "ms" / "detections.json").read_text())
    assert [s["factor"] for s in doc["images"][0]["scales"]] == [1.0, 0.5] and doc["tta"] is None
    assert detect_main(["run", str(root / "model"), str(frames), "--out", str(root / "tta"), "--threshold", "0.01",
                        "--scales", "1,0.5", "--bands", "0-30,30-inf", "--tta", "flips"]) == 0
    flipped = json.loads((root / "tta" / "detections.json").read_text())
    assert flipped["tta"] == "flips" and flipped["images"][0]["tiles"] == doc["images"][0]["tiles"]
    assert doc["images"][0]["tiles"] == sum(s["tiles"] for s in doc["images"][0]["scales"])
    for argv, what in ((["--bands", "0-30"], "--bands needs --scales"),
                       (["--scales", "1,0.5", "--bands", "0-30"], "one MIN-MAX band for each of the 2 scales"),
                       (["--scales", "1,0.5", "--scale", "2"], "leave out --scale")):
        assert detect_main(["run", str(root / "model"), str(frames), "--out", str(root / "x")] + argv) == 2
        assert what in capsys.readouterr().err


def test_a_build_from_a_later_frame_is_labelled_under_its_own_suns(boxed_world, tmp_path):
    """A build from --first-frame K keeps its poses from frame 0 and lists frames K on in its
    metadata: each frame is labelled with its own Sun (the same boxes as the build from frame 0
    gives that frame), and only the frames built are labelled, with or without their images; the
    lost-in-space scenario refuses such a build and says how to build one it takes."""
    from trn.data.datasets.luna1 import read_luna1

    build_luna1(BuildConfig(source=boxed_world, out=tmp_path / "a", limit_frames=8, limit_craters=4, workers=1,
                            render=SMALL, annotate=RULE, render_frames=False))
    build_luna1(BuildConfig(source=boxed_world, out=tmp_path / "b", first_frame=5, limit_frames=3, limit_craters=4,
                            workers=1, render=SMALL, annotate=RULE, render_frames=False))
    assert [f["frame"] for f in read_luna1(tmp_path / "b").metadata.frames] == [5, 6, 7]
    whole = {f.frame: f for f in label_build(tmp_path / "a", boxed_world, all_frames=True).frames}
    later = label_build(tmp_path / "b", boxed_world, all_frames=True).frames
    assert [f.frame for f in later] == [5, 6, 7]
    assert all(f.boxes == whole[f.frame].boxes and f.sun_elevation_deg == whole[f.frame].sun_elevation_deg
               for f in later)
    # the scenarios index their frames by pose row: such a build is refused with the way out
    from trn.errors import DataError
    from trn.nav.scenario import lost_in_space_fixes

    with pytest.raises(DataError, match="one metadata frame per pose"):
        lost_in_space_fixes(read_luna1(tmp_path / "b"), None, None)


def test_navigation_scenarios_take_the_detectors_boxes(det_run, boxed_world, tmp_path):
    from trn.data.datasets.luna1 import read_luna1
    from trn.sim.boxes import FALSE_ID_BASE, with_boxes

    root, _, _, _ = det_run
    build_luna1(BuildConfig(source=boxed_world, out=tmp_path / "b", limit_frames=6, limit_craters=4, workers=1,
                            render=SMALL, annotate=RULE))
    label_build(tmp_path / "b", boxed_world)
    ds = read_luna1(tmp_path / "b")
    union, _ = with_boxes(ds, "union")
    assert [f.frame for f in union.frames] == [f.frame for f in read_labels(tmp_path / "b").frames]
    from trn.errors import DataError
    from trn.models.checkpoint import load_checked, save_checked

    ck = load_checked(root / "run" / "best.pt", fmt="trn-detector-checkpoint", what="detector")
    save_checked({**ck, "score_threshold": 1.0}, tmp_path / "none.pt")
    with pytest.raises(DataError, match="found no crater"):
        with_boxes(ds, "detector", tmp_path / "none.pt")
    save_checked({**ck, "score_threshold": 0.0}, tmp_path / "low.pt")  # an untrained detector scores low
    det, summary = with_boxes(ds, "detector", tmp_path / "low.pt")
    assert summary["boxes"] == "detector" and len(det.frames) == len(union.frames)
    labelled = {b.id for f in union.frames for b in f.boxes}
    for f in det.frames:
        for b in f.boxes:
            assert b.id in labelled or b.id >= FALSE_ID_BASE
    with pytest.raises(ConfigError, match="boxes"):
        with_boxes(ds, "yolo")


@pytest.mark.parametrize("argv, what", [
    (["train", "--config", "nope.yaml", "--out", "x"], "does not exist"),
    (["eval", "nope", "--data", "x"], "does not exist"),
    (["run", "nope", "x", "--out", "y"], "does not exist"),
])
def test_bad_command_lines_get_one_clear_line(argv, what, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert detect_main(argv) == 2
    assert what in capsys.readouterr().err


def test_export_keeps_parity_and_int8_scores_like_float(det_run):
    pytest.importorskip("onnxruntime")
    root, labels, _, _ = det_run
    assert detect_main(["export", str(root / "run"), "--out", str(root / "export"), "--data", str(root / "data"),
                        "--calib-frames", "4"]) == 0
    doc = json.loads((root / "export" / "export_report.json").read_text())
    assert doc["parity_fp32"]["max_abs_heat"] < 1e-4 and doc["parity_fp32"]["max_abs_size"] < 1e-3
    ops = doc["exports"][1]["ops"]
    assert set(ops) <= {"Add", "Constant", "Conv", "DequantizeLinear", "QuantizeLinear", "Relu", "Resize", "Sigmoid"}
    assert doc["tflite"]["lowering_max_abs_error"] < 1e-4 and doc["edgetpu"]["ready"]
    assert set(doc["edgetpu"]["ops"]) <= {"ADD", "CONV_2D", "LOGISTIC", "PAD", "RESIZE_NEAREST_NEIGHBOR"}
    v = doc["validation"]
    assert set(v) == {"torch", "onnx-fp32", "onnx-int8", "tflite-int8"}
    for d, s in v["torch"].items():
        assert v["onnx-fp32"][d]["labels"] == s["labels"]
        assert v["onnx-fp32"][d]["hits"] == pytest.approx(s["hits"], abs=1)


def test_trn_sim_runs_the_navigation_scenarios_on_each_kind_of_box(det_run, boxed_world, tmp_path):
    from trn.cli.sim import main as sim_main

    root, _, _, _ = det_run
    build_luna1(BuildConfig(source=boxed_world, out=tmp_path / "b", limit_frames=6, limit_craters=4, workers=1,
                            render=SMALL, annotate=RULE))
    label_build(tmp_path / "b", boxed_world)
    from trn.models.checkpoint import load_checked, save_checked

    # an untrained detector's scores are low: a threshold that lets its boxes through
    ck = load_checked(root / "run" / "best.pt", fmt="trn-detector-checkpoint", what="detector")
    save_checked({**ck, "score_threshold": 0.0}, tmp_path / "low.pt")
    out = tmp_path / "report"
    assert sim_main(["run", "luna1", "--data", str(tmp_path / "b"), "--scenario", "moon_navigation",
                     "--boxes", "annotations,union,detector", "--detector",
                     str(tmp_path / "low.pt"), "--threads", "1", "--no-progress", "--out", str(out)]) == 0
    doc = json.loads((out / "report.json").read_text())
    methods = {r["method"] for r in doc["results"]}
    assert {m.split(" [")[-1] for m in methods} == {"flight_pair", "union boxes]", "detector boxes]"}
    # frame crops of every box kind reach the pair's frame descriptor only
    from trn.models.registry import DEFAULT_MODEL, read_pair

    frames = read_pair(DEFAULT_MODEL).frames
    assert {r["extra"]["descriptor"] for r in doc["results"]} == {frames}
    assert set(doc["context"]["boxes"]) == {"annotations", "union", "detector"}


def test_best_epoch_is_chosen_by_the_recorded_ap_as_the_threshold_is():
    """An epoch whose AP rounds up to the best recorded value is the best (the bug that kept an
    earlier epoch in best.pt); a later epoch wins a tie; a worse one is not the best."""
    from trn.detect.model import chosen_threshold
    from trn.train.detector import is_best

    h = [{"epoch": 1, "val_ap50": 0.6293, "val_threshold": 0.33}, {"epoch": 2, "val_ap50": 0.6376, "val_threshold": 0.35}]
    assert is_best(h) and chosen_threshold({"history": h}) == 0.35
    assert is_best(h + [{"epoch": 3, "val_ap50": 0.6376, "val_threshold": 0.3}])
    assert not is_best(h + [{"epoch": 3, "val_ap50": 0.6375, "val_threshold": 0.3}])


def test_the_selection_rule_can_weigh_each_set_alike():
    """Under select="mean_of_sets" an epoch is chosen by the mean of its sets' AP, not the pooled
    AP that the set with more labels rules; the threshold follows the chosen epoch."""
    from trn.detect.model import chosen_threshold
    from trn.train.detector import is_best

    h = [{"epoch": 1, "val_ap50": 0.60, "val_select": 0.55, "val_threshold": 0.3},
         {"epoch": 2, "val_ap50": 0.62, "val_select": 0.50, "val_threshold": 0.4}]
    assert not is_best(h) and chosen_threshold({"history": h}) == 0.3
    assert is_best(h[:1] + [{**h[1], "val_select": 0.56}])
    with pytest.raises(ConfigError, match="select='best'"):
        DetectTrainConfig(data=("a",), select="best")
    cfg = DetectTrainConfig.from_dict({"data": ["a", "b"], "select": "mean_of_sets"})
    assert DetectTrainConfig.from_dict(cfg.to_dict()) == cfg


def test_a_run_over_several_sets_records_each_sets_ap(det_run, boxed_world, tmp_path):
    root, _, cfg, _ = det_run
    build_luna1(BuildConfig(source=boxed_world, out=tmp_path / "b", limit_frames=8, limit_craters=4, workers=1,
                            render=SMALL, annotate=RULE))
    from trn.data.datasets.detection import label_subset

    label_subset(tmp_path / "b", boxed_world, tmp_path / "sub", every=2, val_frames=1)
    two = DetectTrainConfig(**{**cfg.__dict__, "data": (str(root / "data"), str(tmp_path / "sub")),
                               "select": "mean_of_sets", "epochs": 1})
    rec = train_detector(two, tmp_path / "run")[0]
    per = rec["val_sets_ap50"]
    assert set(per) <= {"data", "sub"} and "data" in per
    assert rec["val_select"] == pytest.approx(float(np.mean(list(per.values()))), abs=1e-4)


def test_each_set_gives_at_most_its_share_of_an_epochs_frames():
    """frames_per_set draws at most N frames of each data directory (all of a smaller one), a new
    draw each epoch; val_frames_per_set keeps the same validation frames every epoch; bad counts
    are refused."""
    from trn.train.detector import per_set

    sets = np.array([0] * 50 + [1] * 3 + [2] * 400)
    a, b = per_set(sets, 10, np.random.default_rng(0)), per_set(sets, 10, np.random.default_rng(1))
    for idx in (a, b):
        assert [int((sets[idx] == j).sum()) for j in range(3)] == [10, 3, 10]
        assert len(set(idx.tolist())) == len(idx) and np.all(np.diff(idx) > 0)
    assert not np.array_equal(a, b)
    assert np.array_equal(per_set(sets, 10, np.random.default_rng(0)), a)
    for name in ("frames_per_set", "val_frames_per_set"):
        with pytest.raises(ConfigError, match=name):
            DetectTrainConfig(data=("a",), **{name: -1})
    cfg = DetectTrainConfig.from_dict({"data": ["a"], "frames_per_set": 800, "val_frames_per_set": 300})
    assert DetectTrainConfig.from_dict(cfg.to_dict()) == cfg


def test_set_shares_weight_one_directorys_part_of_an_epoch():
    """set_shares scales frames_per_set per data directory: [2, 1] draws twice as many of the first
    directory's frames; a share list of the wrong length, a zero share, or shares without
    frames_per_set are refused by name."""
    from trn.train.detector import per_set

    cfg = DetectTrainConfig(data=("a", "b", "c"), frames_per_set=10, set_shares=(2, 1, 0.5))
    assert cfg.frames_per_directory() == [20, 10, 5]
    assert DetectTrainConfig(data=("a", "b"), frames_per_set=10).frames_per_directory() == [10, 10]
    sets = np.array([0] * 50 + [1] * 50 + [2] * 50)
    idx = per_set(sets, cfg.frames_per_directory(), np.random.default_rng(0))
    assert [int((sets[idx] == j).sum()) for j in range(3)] == [20, 10, 5]
    assert DetectTrainConfig.from_dict(cfg.to_dict()) == cfg
    for bad in ({"set_shares": (2, 1)}, {"set_shares": (0, 1, 1)}, {"set_shares": (1, 1, 1), "frames_per_set": 0}):
        with pytest.raises(ConfigError, match="set_shares"):
            DetectTrainConfig(**{"data": ("a", "b", "c"), "frames_per_set": 10, **bad})
    with pytest.raises(ConfigError, match="set_shares"):
        DetectTrainConfig.from_dict({"data": ["a"], "frames_per_set": 10, "set_shares": 2})


def test_a_run_with_frames_per_set_trains_on_its_draw_and_validates_on_a_fixed_few(det_run, tmp_path):
    """A run bounded to 4 training frames of its one set and 3 validation frames loads more than 4
    training frames, keeps at most 3 for validation, and completes its epoch."""
    from trn.train.detector import frame_sets

    root, _, cfg, _ = det_run
    small = DetectTrainConfig(**{**cfg.__dict__, "frames_per_set": 4, "val_frames_per_set": 3, "epochs": 1})
    train, val = frame_sets(small)
    assert len(train.frames) > 4 and len(val.frames) <= 3
    rec = train_detector(small, tmp_path / "run")[0]
    assert rec["epoch"] == 1


def test_a_training_set_from_a_build_keeps_every_nth_frame_and_splits_its_tail(boxed_world, tmp_path, capsys):
    build_luna1(BuildConfig(source=boxed_world, out=tmp_path / "b", limit_frames=8, limit_craters=4, workers=1,
                            render=SMALL, annotate=RULE))
    images = tmp_path / "b" / "lro_navigation" / "nav_images"
    rendered = sorted(int(p.stem) for p in images.glob("*.png"))
    before = sorted(p.name for p in (tmp_path / "b").rglob("*"))
    assert detect_main(["label", str(tmp_path / "b"), "--source", str(boxed_world), "--out", str(tmp_path / "sub"),
                        "--every", "3", "--val-frames", "1"]) == 0
    labels = read_labels(tmp_path / "sub")
    kept = rendered[::3]
    assert [f.frame for f in labels.frames] == kept
    assert [f.split for f in labels.frames] == ["train"] * (len(kept) - 1) + ["val"]
    assert all(labels.image_path(k).is_file() for k in kept)
    # the same boxes as labelling the whole build; the build itself is left as it was
    assert sorted(p.name for p in (tmp_path / "b").rglob("*")) == before
    whole = {f.frame: f.boxes for f in label_build(tmp_path / "b", boxed_world).frames}
    assert all(f.boxes == whole[f.frame] for f in labels.frames)
    # an existing set is not overwritten; a stride that leaves no training frame is refused
    assert detect_main(["label", str(tmp_path / "b"), "--source", str(boxed_world), "--out", str(tmp_path / "sub"),
                        "--every", "3"]) == 2
    assert "already holds detection labels" in capsys.readouterr().err
    assert detect_main(["label", str(tmp_path / "b"), "--source", str(boxed_world), "--out", str(tmp_path / "s2"),
                        "--every", "3", "--val-frames", str(len(kept))]) == 2
    assert "leave some for training" in capsys.readouterr().err
    assert detect_main(["label", str(tmp_path / "b"), "--source", str(boxed_world), "--every", "3"]) == 2
    assert "give its --out directory" in capsys.readouterr().err


def test_ship_takes_a_named_checkpoint_and_a_threshold_chosen_elsewhere(det_run, tmp_path, capsys):
    from trn.detect.model import load_detector

    root, _, _, _ = det_run
    ck = root / "run" / "last.pt"
    assert detect_main(["ship", str(ck), "--out", str(tmp_path / "m"), "--threshold", "0.42",
                        "--chosen-by", "highest AP on the real tiles"]) == 0
    _, meta = load_detector(tmp_path / "m" / "detector.pt")
    assert meta["score_threshold"] == 0.42 and meta["epoch"] == load_detector(ck)[1]["epoch"]
    card = (tmp_path / "m" / "MODEL_CARD.md").read_text()
    assert f"Selected epoch {meta['epoch']} (highest AP on the real tiles)" in card and "chosen on validation images" in card
    assert detect_main(["ship", str(tmp_path / "nothing"), "--out", str(tmp_path / "m2")]) == 2
    assert "holds no best.pt" in capsys.readouterr().err
    assert detect_main(["ship", str(ck), "--out", str(tmp_path / "m3"), "--scales", "2,0.5", "--bands", "0-20"]) == 2
    assert "one MIN-MAX band" in capsys.readouterr().err


def test_a_model_shipped_with_its_scales_runs_at_them_unless_told_otherwise(det_run, tmp_path, capsys):
    root, labels, _, _ = det_run
    m = tmp_path / "m"
    assert detect_main(["ship", str(root / "run" / "last.pt"), "--out", str(m), "--scales", "2,0.5",
                        "--bands", "0-20,20-inf"]) == 0
    assert "Scales for trn-detect run: 2,0.5, bands 0-20,20-inf" in (m / "MODEL_CARD.md").read_text()
    frames = str(labels.image_path(labels.frames[0].frame).parent)
    capsys.readouterr()
    assert detect_main(["run", str(m), frames, "--out", str(tmp_path / "o"), "--threshold", "0.01"]) == 0
    assert "the model's own" in capsys.readouterr().out
    rec = json.loads((tmp_path / "o" / "detections.json").read_text())["images"][0]
    assert [s["factor"] for s in rec["scales"]] == [2.0, 0.5] and rec["scale_source"].startswith("the model's own")
    # a scale on the command line wins; a model shipped without scales keeps the one-scale rules
    assert detect_main(["run", str(m), frames, "--out", str(tmp_path / "o2"), "--scale", "1"]) == 0
    rec = json.loads((tmp_path / "o2" / "detections.json").read_text())["images"][0]
    assert "scales" not in rec and rec["scale"] == 1.0


def test_crater_sizes_keep_or_move_the_scales_a_model_carries(det_run, tmp_path, capsys):
    root, labels, _, _ = det_run
    m = tmp_path / "m"
    assert detect_main(["ship", str(root / "run" / "last.pt"), "--out", str(m), "--scales", "2,0.5",
                        "--bands", "0-20,20-inf", "--scales-crater-px", "8,80"]) == 0
    assert "whose craters span 8-80 px" in (m / "MODEL_CARD.md").read_text()
    frames = str(labels.image_path(labels.frames[0].frame).parent)

    def factors(out, *extra):
        assert detect_main(["run", str(m), frames, "--out", str(tmp_path / out), "--threshold", "0.01", *extra]) == 0
        rec = json.loads((tmp_path / out / "detections.json").read_text())["images"][0]
        return [s["factor"] for s in rec["scales"]], [float(s["max_px"]) for s in rec["scales"]], rec["scale_source"]

    capsys.readouterr()
    assert factors("inside", "--crater-px", "10,60")[:2] == ([2.0, 0.5], [20.0, float("inf")])
    assert "which hold --crater-px 10-60" in capsys.readouterr().out
    f, edges, source = factors("outside", "--crater-px", "4,40")   # middle 12.6 px against 25.3: moved by 2
    assert f == pytest.approx([4.0, 1.0]) and edges[0] == pytest.approx(10.0) and "moved by 2" in source
    # a model that does not say where its scales were chosen takes one scale from --crater-px, as before
    m2 = tmp_path / "m2"
    assert detect_main(["ship", str(root / "run" / "last.pt"), "--out", str(m2), "--scales", "2,0.5"]) == 0
    assert detect_main(["run", str(m2), frames, "--out", str(tmp_path / "o"), "--crater-px", "4,40"]) == 0
    rec = json.loads((tmp_path / "o" / "detections.json").read_text())["images"][0]
    assert "scales" not in rec and "craters of 4-40 image px" in rec["scale_source"]
    capsys.readouterr()
    assert detect_main(["ship", str(root / "run" / "last.pt"), "--out", str(tmp_path / "m3"),
                        "--scales-crater-px", "8,80"]) == 2
    assert "give --scales too" in capsys.readouterr().err


def test_moved_bands_keep_a_range_inside_move_a_narrow_one_just_inside_and_centre_a_wide_one():
    from trn.detect.tiles import ScaleBand, moved_bands

    bands = [ScaleBand(2.5, 0.0, 48.0), ScaleBand(0.5, 48.0)]
    assert moved_bands(bands, (8.0, 340.0), (12.0, 80.0)) == (bands, 1.0, True)
    assert moved_bands(bands, (8.0, 340.0), (8.0, 340.0)) == (bands, 1.0, True)
    # no wider than the chosen range: moved only as far as it must be, so k grows from 1 at the edges
    out, k, kept = moved_bands(bands, (8.0, 340.0), (4.0, 170.0))
    assert not kept and k == pytest.approx(2.0)
    assert [b.factor for b in out] == pytest.approx([5.0, 1.0])
    assert out[0].max_px == pytest.approx(24.0) and out[1].min_px == pytest.approx(24.0)
    assert out[1].max_px == float("inf")
    assert moved_bands(bands, (8.0, 340.0), (7.9, 9.0))[1] == pytest.approx(8.0 / 7.9)
    assert moved_bands(bands, (8.0, 340.0), (300.0, 341.0))[1] == pytest.approx(340.0 / 341.0)
    # wider: the geometric middles meet (here they already do: moved by 1, yet not kept)
    out, k, kept = moved_bands(bands, (8.0, 340.0), (4.0, 680.0))
    assert k == pytest.approx(1.0) and not kept
    out, k, _ = moved_bands(bands, (8.0, 340.0), (2.0, 680.0))
    assert k == pytest.approx(math.sqrt(8 * 340) / math.sqrt(2 * 680))
    with pytest.raises(ConfigError, match="too far"):
        moved_bands(bands, (8.0, 340.0), (0.001, 0.002))


def test_a_shipped_model_shipped_again_with_new_scales_keeps_its_weights_and_centre_error(det_run, tmp_path,
                                                                                           capsys):
    import shutil

    import torch

    from trn.detect.model import load_detector

    root, _, _, _ = det_run
    m = tmp_path / "m"
    assert detect_main(["ship", str(root / "run" / "last.pt"), "--out", str(m), "--threshold", "0.3"]) == 0
    _, first = load_detector(m / "detector.pt")
    # shipped again from a copy, with its training data gone: the centre error it carries is kept
    copy = tmp_path / "copy"
    shutil.copytree(m, copy)
    shutil.move(str(root / "data"), str(tmp_path / "data-away"))
    try:
        capsys.readouterr()
        assert detect_main(["ship", str(copy / "detector.pt"), "--out", str(m), "--threshold", "0.3", "--scales",
                            "2,0.5", "--bands", "0-30,30-inf"]) == 0
        assert "box centre error" in capsys.readouterr().out
        # without --threshold it keeps its own, and its centre error
        assert detect_main(["ship", str(copy / "detector.pt"), "--out", str(tmp_path / "m1")]) == 0
        assert load_detector(tmp_path / "m1" / "detector.pt")[1]["score_threshold"] == 0.3
        # another threshold is another operating point: its centre error is measured again, from the data
        assert detect_main(["ship", str(copy / "detector.pt"), "--out", str(tmp_path / "m2"), "--threshold",
                            "0.4"]) == 2
    finally:
        shutil.move(str(tmp_path / "data-away"), str(root / "data"))
    again, meta = load_detector(m / "detector.pt")
    before, _ = load_detector(copy / "detector.pt")
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), before.state_dict().values()))
    assert meta["centre_sigma_px"] == first["centre_sigma_px"] and meta["run_scales"] == "2,0.5"
    assert meta["score_threshold"] == 0.3


def test_a_model_shipped_with_test_time_symmetry_uses_it_unless_told_none(det_run, tmp_path, capsys):
    root, labels, _, _ = det_run
    m = tmp_path / "m"
    assert detect_main(["ship", str(root / "run" / "last.pt"), "--out", str(m), "--tta", "flips"]) == 0
    assert "Test-time symmetry for trn-detect run: flips, 4 views" in (m / "MODEL_CARD.md").read_text()
    frames = str(labels.image_path(labels.frames[0].frame).parent)
    capsys.readouterr()
    assert detect_main(["run", str(m), frames, "--out", str(tmp_path / "o"), "--scale", "1"]) == 0
    assert "test-time symmetry flips (4 views of each tile): the model's own" in capsys.readouterr().out
    assert json.loads((tmp_path / "o" / "detections.json").read_text())["tta"] == "flips"
    assert detect_main(["run", str(m), frames, "--out", str(tmp_path / "o2"), "--scale", "1", "--tta", "none"]) == 0
    assert json.loads((tmp_path / "o2" / "detections.json").read_text())["tta"] is None
    with pytest.raises(SystemExit) as e:
        detect_main(["ship", str(root / "run" / "last.pt"), "--out", str(tmp_path / "m2"), "--tta", "all"])
    assert e.value.code == 2 and "invalid choice: 'all'" in capsys.readouterr().err


def test_running_mean_is_the_plain_mean_of_the_weight_sets():
    from trn.train.detector import running_mean

    states = [{"w": torch.tensor([float(i), 2.0 * i]), "n": torch.tensor(i)} for i in range(1, 5)]
    mean = None
    for k, s in enumerate(states):
        mean = running_mean(mean, s, k)
    assert torch.allclose(mean["w"], torch.tensor([2.5, 5.0])) and int(mean["n"]) == 4
    assert states[0]["w"].tolist() == [1.0, 2.0]  # the first set is copied, not aliased


def test_averaged_weights_survive_a_resume_are_validated_and_shipped(det_run, tmp_path):
    root, _, cfg, _ = det_run
    avg = DetectTrainConfig(**{**cfg.__dict__, "epochs": 3, "average_from": 2, "bn_batches": 3})
    with pytest.raises(ConfigError, match="average_from"):
        DetectTrainConfig(**{**avg.__dict__, "average_from": 4})
    train_detector(avg, tmp_path / "a")  # uninterrupted
    train_detector(avg, tmp_path / "b", stop_after=2)  # stopped after epoch 2, inside the window
    assert "average" in torch.load(tmp_path / "b" / "last.pt", weights_only=False)
    assert not (tmp_path / "b" / "averaged.pt").exists()
    train_detector(avg, tmp_path / "b", resume=True)
    a, b = (torch.load(tmp_path / r / "averaged.pt", weights_only=False) for r in ("a", "b"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])  # resuming changes nothing
    assert a["averaged"]["averaged_epochs"] == [2, 3] and 0.0 <= a["averaged"]["val_ap50"] <= 1.0
    last, e2 = a["model"], torch.load(tmp_path / "a" / "last.pt", weights_only=False)["model"]
    conv = next(k for k in last if k.endswith("weight") and last[k].dim() == 4)
    assert not torch.equal(last[conv], e2[conv])  # the average is not the last epoch's weights
    model, meta = load_detector(tmp_path / "a" / "averaged.pt")
    assert meta["averaged"]["val_threshold"] == a["averaged"]["val_threshold"]
    assert detect_main(["ship", str(tmp_path / "a" / "averaged.pt"), "--out", str(tmp_path / "m")]) == 0
    card = (tmp_path / "m" / "MODEL_CARD.md").read_text()
    assert "Weights averaged over epochs 2-3, BatchNorm statistics re-estimated on 3 training batches" in card
    assert load_detector(tmp_path / "m" / "detector.pt")[1]["score_threshold"] == a["averaged"]["val_threshold"]
    from trn.train.detector import shipped_checkpoint
    from trn.detect.model import CHECKPOINT_FORMAT as DETECTOR
    from trn.models.checkpoint import load_checked, save_checked

    for score, chosen in ((1.0, "averaged.pt"), (-1.0, "best.pt")):
        ck = load_checked(tmp_path / "a" / "averaged.pt", fmt=DETECTOR)
        save_checked({**ck, "averaged": {**ck["averaged"], "val_ap50": score}}, tmp_path / "a" / "averaged.pt")
        assert shipped_checkpoint(tmp_path / "a").name == chosen  # the run's rule decides


def test_weights_interpolated_between_a_start_and_a_fine_tune_lie_on_the_line_and_ship(det_run, tmp_path, capsys):
    """(1 - alpha) x start + alpha x end for every weight tensor (BatchNorm statistics re-estimated
    apart), validated and shipped with a card that says so; alpha outside (0, 1), another
    architecture or an averaged end are refused."""
    root, _, cfg, _ = det_run
    tune = DetectTrainConfig(**{**cfg.__dict__, "epochs": 1, "lr": 5e-3, "bn_batches": 2,
                                "init": str(root / "run" / "best.pt")})
    train_detector(tune, tmp_path / "tune")
    start, end = root / "run" / "best.pt", tmp_path / "tune" / "last.pt"
    assert detect_main(["interpolate", str(start), str(end), "--alpha", "0.25", "--out", str(tmp_path / "i")]) == 0
    assert "interpolated 0.75 x" in capsys.readouterr().out
    a, b = (torch.load(p, weights_only=False)["model"] for p in (start, end))
    got = torch.load(tmp_path / "i" / "interpolated.pt", weights_only=False)
    conv = [k for k in b if k.endswith("weight") and b[k].dim() == 4]
    assert conv and not torch.equal(a[conv[0]], b[conv[0]])
    for k in conv:
        assert torch.allclose(got["model"][k], 0.75 * a[k] + 0.25 * b[k], atol=1e-6)
    rec = got["averaged"]
    assert rec["alpha"] == 0.25 and rec["interpolated_from"] == str(start) and 0.0 <= rec["val_ap50"] <= 1.0
    assert detect_main(["ship", str(tmp_path / "i" / "interpolated.pt"), "--out", str(tmp_path / "m")]) == 0
    card = (tmp_path / "m" / "MODEL_CARD.md").read_text()
    assert f"Weights interpolated, 0.75 x {start} + 0.25 x epoch 1 of this run" in card
    for alpha in ("0", "1", "-0.5"):
        assert detect_main(["interpolate", str(start), str(end), "--alpha", alpha, "--out", str(tmp_path / "x")]) == 2
        assert "alpha" in capsys.readouterr().err
    assert detect_main(["interpolate", str(start), str(tmp_path / "i" / "interpolated.pt"), "--alpha", "0.5",
                        "--out", str(tmp_path / "x")]) == 2
    assert "epoch checkpoint" in capsys.readouterr().err
    other = DetectTrainConfig(**{**cfg.__dict__, "epochs": 1,
                                 "model": DetectorConfig(input_size=64, widths=(4, 8, 8, 8, 16), neck=8)})
    train_detector(other, tmp_path / "other")
    assert detect_main(["interpolate", str(start), str(tmp_path / "other" / "last.pt"), "--alpha", "0.5",
                        "--out", str(tmp_path / "x")]) == 2
    assert "different architectures" in capsys.readouterr().err


def test_kept_epochs_averaged_afterwards_equal_the_average_made_in_training(det_run, tmp_path, capsys):
    import shutil

    root, _, cfg, _ = det_run
    plain = DetectTrainConfig(**{**cfg.__dict__, "epochs": 3, "bn_batches": 3})
    kept = []
    for e in range(3):  # a run whose every epoch was kept
        train_detector(plain, tmp_path / "run", resume=e > 0, stop_after=1)
        kept.append(str(shutil.copy(tmp_path / "run" / "last.pt", tmp_path / f"epoch_{e + 1}.pt")))
        shutil.copy(tmp_path / "run" / "last.pt.sha256", tmp_path / f"epoch_{e + 1}.pt.sha256")
    inline = DetectTrainConfig(**{**plain.__dict__, "average_from": 2})
    train_detector(inline, tmp_path / "inline")
    assert detect_main(["average", kept[2], kept[1], "--out", str(tmp_path / "after")]) == 0
    assert "averaged epochs 2-3" in capsys.readouterr().out
    a = torch.load(tmp_path / "inline" / "averaged.pt", weights_only=False)
    b = torch.load(tmp_path / "after" / "averaged.pt", weights_only=False)
    assert all(torch.allclose(a["model"][k].float(), b["model"][k].float(), atol=1e-6) for k in a["model"])
    assert b["averaged"]["averaged_epochs"] == [2, 3] and b["averaged"]["val_ap50"] == pytest.approx(a["averaged"]["val_ap50"])
    assert detect_main(["average", kept[0], kept[2], "--out", str(tmp_path / "gap")]) == 2
    assert "consecutive" in capsys.readouterr().err
    assert detect_main(["average", kept[0], "--out", str(tmp_path / "one")]) == 2
    assert "two or more" in capsys.readouterr().err
