"""Training configs fail early and clearly; a short run on a tiny set reduces the loss; checkpoints
load with weights_only and resume."""

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from trn.errors import ConfigError
from trn.train.config import from_dict, load_config
from trn.train.loop import load_descriptor, train


def tiny_folder(root: Path, n: int = 24, size: int = 48) -> Path:
    """``n`` identities, each a distinct pattern of dark bowls (crater-like blobs)."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:size, 0:size]
    for i in range(n):
        img = np.full((size, size), 150.0)
        for _ in range(4):
            cx, cy, r = rng.uniform(8, size - 8), rng.uniform(8, size - 8), rng.uniform(3, 9)
            img -= 90 * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))
        cv2.imwrite(str(root / f"lm{i:03d}.png"), np.clip(img, 0, 255).astype(np.uint8))
    return root


def base_doc(path: Path) -> dict:
    return {
        "data": {"kind": "folder", "path": str(path), "test_fraction": 0.0, "val_fraction": 0.25},
        "model": {"preset": "flight", "conv": "conv2d", "attention": "se", "input_size": 32, "layers": [1, 1, 1, 1],
                  "planes": [16, 32, 32, 64], "cardinality": 4, "stem_channels": 16, "embed_dim": 32},
        "loss": "proxy-anchor", "epochs": 6, "batch_size": 12, "lr": 3e-3, "loss_lr": 3e-2, "seed": 1,
    }


@pytest.mark.parametrize("patch, match", [
    ({"optimiser": "sgd"}, "unknown key"),
    ({"model": {"preset": "flight", "widht": 3}}, "unknown key"),
    ({"model": {"preset": "flight", "input_size": 20}}, "input_size=20"),
    ({"loss": "triplet-ish"}, "unknown metric loss"),
    ({"loss": "supcon", "views_per_identity": 1}, "pair-based"),
    ({"mars": {"enabled": True}, "loss": "proxy-anchor", "views_per_identity": 1}, "MARs compares two views"),
    ({"model": {"preset": "nonesuch"}}, "unknown model preset"),
    ({"data": {"kind": "lidar", "path": "x"}}, "data.kind"),
    ({"batch_size": 7}, "batch_size=7"),
    ({"metric_weight": 0}, "nothing to train"),
    ({"orbit_per_batch": 0}, "orbit_per_batch"),
    ({"decision": {"weight": 1, "threshold": 0.97}}, "decision threshold"),
])
def test_bad_configs_fail_before_training(tmp_path, patch, match):
    doc = base_doc(tmp_path)
    doc.update(patch)
    with pytest.raises(ConfigError, match=match):
        from_dict(doc)


def test_config_file_and_overrides(tmp_path):
    import yaml

    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(base_doc(tmp_path)))
    cfg = load_config(p, ["epochs=3", "model.attention=ca", "mars.enabled=true"])
    assert cfg.epochs == 3 and cfg.model.attention == "ca" and cfg.mars.enabled
    with pytest.raises(ConfigError, match="not valid YAML"):
        (tmp_path / "bad.yaml").write_text("data: [unclosed")
        load_config(tmp_path / "bad.yaml")


def test_short_training_reduces_the_loss_and_checkpoints_round_trip(tmp_path):
    torch.set_num_threads(2)
    data = tiny_folder(tmp_path / "data")
    doc = base_doc(data)
    doc.update({"epochs": 14, "lr": 1e-3, "loss_lr": 1e-2})
    cfg = from_dict(doc)
    state = train(cfg, tmp_path / "run")
    hist = [h["metric_loss"] for h in state.history]
    assert len(hist) == 14
    assert np.mean(hist[-3:]) < 0.8 * np.mean(hist[:3]), hist
    for name in ("config.yaml", "split.json", "log.jsonl", "last.pt", "best.pt", "weights.pt", "curves.png"):
        assert (tmp_path / "run" / name).is_file()
    ck = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert ck["epoch"] == 14
    model = load_descriptor(tmp_path / "run" / "weights.pt")
    e = model(torch.rand(3, 1, 32, 32))
    assert e.shape == (3, 32) and torch.allclose(e.norm(dim=1), torch.ones(3), atol=1e-5)
    split = json.loads((tmp_path / "run" / "split.json").read_text())
    assert not set(split["train"]) & set(split["val"])


def test_mars_training_logs_every_stage_and_resumes(tmp_path):
    torch.set_num_threads(2)
    data = tiny_folder(tmp_path / "data", n=16)
    doc = base_doc(data)
    doc.update({"epochs": 2, "mars": {"enabled": True}, "model": {**doc["model"], "conv": "ric", "attention": "ca"}})
    cfg = from_dict(doc)
    train(cfg, tmp_path / "run")
    lines = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert {"mars_stage0", "mars_stage1", "mars_stage2", "mars_stage3"} <= set(lines[0])
    doc["epochs"] = 3
    with pytest.raises(ConfigError, match="another configuration"):
        train(from_dict(doc), tmp_path / "run", resume=True)
    state = train(cfg, tmp_path / "run2")
    assert state.epoch == 2
    with pytest.raises(ConfigError, match="already holds a training run"):
        train(cfg, tmp_path / "run2")
    # the threads that run it are not what it trains: a run resumes on another count of them
    doc["epochs"] = 2
    assert train(from_dict({**doc, "threads": cfg.threads + 1}), tmp_path / "run2", resume=True).epoch == 2


def test_corrupt_checkpoint_is_refused(tmp_path):
    from trn.errors import DataError

    p = tmp_path / "x.pt"
    p.write_bytes(b"not a checkpoint")
    with pytest.raises(DataError, match="no checksum file"):
        load_descriptor(p)
    import hashlib

    (tmp_path / "x.pt.sha256").write_text(hashlib.sha256(b"not a checkpoint").hexdigest() + "  x.pt\n")
    with pytest.raises(DataError, match="corrupt"):
        load_descriptor(p)


def test_model_card(tmp_path):
    import yaml

    from trn.train.card import write_model_card

    run = tmp_path / "run"
    run.mkdir()
    cfg = from_dict(base_doc(tmp_path))
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    (run / "log.jsonl").write_text("\n".join(json.dumps({"epoch": e, "val_recall_at_1": r, "seconds": 60.0})
                                             for e, r in ((1, 0.5), (2, 0.75), (3, 0.7))) + "\n")
    (run / "split.json").write_text(json.dumps({"train": ["a"] * 10, "val": ["b"] * 2, "test": ["c"] * 12}))
    text = write_model_card(run, "Test model", "trn-train --config x.yaml --out run", "tiny").read_text()
    assert "75.00% on the validation gallery at epoch 2" in text and "3.0 min" in text
    assert "10 train / 2 validation / 12 test" in text and "`weights.pt` (epoch 2" in text
    last = write_model_card(run, "Test model", "x", "tiny", weights_epoch="last").read_text()
    assert "70.00% on the validation gallery at epoch 3" in last
    assert "Part tokens" not in last
    # a part model's card names its head and the rule that decides where its tokens are scored
    (run / "parts.json").write_text(json.dumps({
        "settings": {"dim": 128, "hidden": 512, "stage": -2, "weight": 0.5, "edge_px": 20, "offset": 0.1, "epochs": 30},
        "views": 2855, "craters": 352, "orbits": ["data/o1", "data/o2"], "loss": [3.0, 1.25], "seconds": 171.0}))
    parts = write_model_card(run, "Test model", "x", "tiny").read_text()
    assert "Part tokens" in parts and "128-d from stage -2" in parts and "within 20 px" in parts and "offset 0.1" in parts
    assert "2855 views of 352 training-orbit craters (o1, o2)" in parts and "`parts.json`" in parts
    # a head trained with the descriptor is read from the run's config
    (run / "parts.json").unlink()
    doc = yaml.safe_load((run / "config.yaml").read_text())
    doc["model"].update(part_dim=16, part_edge_px=20, part_offset=0.1)
    doc["parts"] = {"weight": 1.0, "temperature": 0.05}
    (run / "config.yaml").write_text(yaml.safe_dump(doc))
    joint = write_model_card(run, "Test model", "x", "tiny").read_text()
    assert "Part tokens trained with the descriptor (`parts.weight` 1.0" in joint and "16-d from stage -2" in joint
    assert "within 20 px" in joint


def test_union_training_set_keeps_every_test_half_out(tmp_path):
    from trn.train.config import DataConfig
    from trn.train.data import load_landmarks, split_identities, training_set

    a, b = tiny_folder(tmp_path / "a", n=20), tiny_folder(tmp_path / "b", n=16)
    cfg = DataConfig(kind="folder", path=str(a), test_fraction=0.5, val_fraction=0.2, also=(str(b),))
    ls, split = training_set(cfg)
    own_a = split_identities(load_landmarks(DataConfig(kind="folder", path=str(a), test_fraction=0.5, val_fraction=0.2)),
                             DataConfig(kind="folder", path=str(a), test_fraction=0.5, val_fraction=0.2))
    own_b = split_identities(load_landmarks(DataConfig(path=str(b))), DataConfig(path=str(b), val_fraction=0.2))
    # each dataset is split exactly as it is on its own (trn-sim's test half), the extra one prefixed
    assert split.train == own_a.train + [f"1:{i}" for i in own_b.train]
    assert split.val == own_a.val + [f"1:{i}" for i in own_b.val]
    assert not (set(split.train) | set(split.val)) & (set(own_a.test) | {f"1:{i}" for i in own_b.test})
    assert len(ls.instances) == 36 and all(i in ls.instances for i in split.train)
    doc = base_doc(a)
    doc["data"]["also"] = [str(b)]
    doc["epochs"] = 1
    state = train(from_dict(doc), tmp_path / "run")
    assert state.epoch == 1
    saved = json.loads((tmp_path / "run" / "split.json").read_text())
    assert any(i.startswith("1:") for i in saved["train"])
    for bad in ([str(a)], ["", str(b)], [str(b), str(b)]):
        doc["data"]["also"] = bad
        with pytest.raises(ConfigError, match="data.also"):
            from_dict(doc)


def tiny_luna1_with_frame_views(root: Path, n: int = 24, k: int = 3, test_too: bool = False) -> Path:
    """A Luna-1 layout of ``n`` craters (tiny_folder's patterns) with ``k`` frame views of every
    training and validation crater: each pattern shifted, scaled and darkened, as a frame crop is."""
    from trn.data.datasets.landmarks import split_ids

    tiny_folder(root / "crater_images", n=n)
    for p in (root / "crater_images").glob("lm*.png"):
        p.rename(p.with_name(f"{int(p.stem[2:]) + 1}.png"))
    ids = [str(i) for i in range(1, n + 1)]
    split = split_ids(ids, set(), 0.25, 0.25, 0)
    (root / "frame_views").mkdir()
    rng = np.random.default_rng(5)
    for cid in ids if test_too else split.train + split.val:
        img = cv2.imread(str(root / "crater_images" / f"{cid}.png"), cv2.IMREAD_GRAYSCALE).astype(np.float32)
        for v in range(k):
            m = np.float32([[rng.uniform(0.85, 1.1), 0, rng.uniform(-3, 3)], [0, rng.uniform(0.85, 1.1), rng.uniform(-3, 3)]])
            warped = cv2.warpAffine(img, m, (40, 44), borderMode=cv2.BORDER_REFLECT) * rng.uniform(0.6, 1.0)
            cv2.imwrite(str(root / "frame_views" / f"{cid}_{v}.png"), np.clip(warped, 0, 255).astype(np.uint8))
    return root


def test_frame_view_pairs_follow_the_mix():
    from trn.data.datasets.landmarks import LandmarkSet
    from trn.train.data import ImageBank, pair_rows

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = tiny_luna1_with_frame_views(Path(d) / "l", n=8, k=3, test_too=True)
        from trn.data.datasets.landmarks import read_luna1_landmarks

        ls = read_luna1_landmarks(root, frame_views=True)
        assert [it.view for it in ls.items if it.instance == "1"] == ["render", "frame0", "frame1", "frame2"]
        bank = ImageBank(ls, ls.instances, 32)
        g = torch.Generator().manual_seed(0)
        ids = list(range(8))
        a, b = pair_rows(bank, ids, (1, 0, 0), g)
        assert all(x == y == bank.views[i][0] for i, x, y in zip(ids, a, b))
        a, b = pair_rows(bank, ids, (0, 1, 0), g)
        assert all(x == bank.views[i][0] and y in bank.frames[i] for i, x, y in zip(ids, a, b))
        a, b = pair_rows(bank, ids, (0, 0, 1), g)
        assert all(x in bank.frames[i] and y in bank.frames[i] and x != y for i, x, y in zip(ids, a, b))
        # an identity without frame views gets a render pair whatever the mix
        only = LandmarkSet("x", tuple(it for it in ls.items if it.instance != "2" or it.view == "render"))
        bank2 = ImageBank(only, only.instances, 32)
        k2 = only.instances.index("2")
        a, b = pair_rows(bank2, [k2], (0, 0, 1), g)
        assert a == b == [bank2.views[k2][0]]


def test_training_with_frame_views_validates_on_them_and_starts_from_weights(tmp_path):
    root = tiny_luna1_with_frame_views(tmp_path / "l", n=24, k=3)
    doc = base_doc(root)
    doc["data"] = {"kind": "luna1", "path": str(root), "test_fraction": 0.25, "val_fraction": 0.25,
                   "frame_views": True}
    doc.update(epochs=2, pair_mix=[0.2, 0.4, 0.4], select="both")
    state = train(from_dict(doc), tmp_path / "a")
    rec = state.history[-1]
    for key in ("val_frame_auc", "val_frame_same_at_threshold", "val_frame_different_p999", "val_frame_ra",
                "val_frame_render_top1"):
        assert key in rec and np.isfinite(rec[key])
    assert 0.0 <= rec["val_frame_auc"] <= 1.0 and 0.0 <= rec["val_frame_ra"] <= 100.0
    # a run that starts from those weights starts where they are
    doc2 = dict(doc, init=str(tmp_path / "a" / "weights.pt"), epochs=1, lr=1e-9, loss_lr=1e-9, pair_mix=[1, 0, 0])
    first = load_descriptor(tmp_path / "a" / "weights.pt")
    train(from_dict(doc2), tmp_path / "b")
    after = load_descriptor(tmp_path / "b" / "weights.pt")
    w0, w1 = dict(first.named_parameters()), dict(after.named_parameters())  # BN running statistics still move
    assert max(float((w0[k] - w1[k]).detach().abs().max()) for k in w0) < 1e-4
    bad = dict(doc2, model=dict(doc["model"], embed_dim=16))
    with pytest.raises(ConfigError, match="architecture differs"):
        train(from_dict(bad), tmp_path / "c")
    with pytest.raises(ConfigError, match="select"):
        from_dict(dict(doc, data=dict(doc["data"], frame_views=False)))
    with pytest.raises(ConfigError, match="pair_mix"):
        from_dict(dict(doc, pair_mix=[0, 0, 0]))


def test_frame_views_of_test_craters_are_refused(tmp_path):
    from trn.errors import DataError
    from trn.train.config import DataConfig
    from trn.train.data import training_set

    root = tiny_luna1_with_frame_views(tmp_path / "l", n=12, k=2, test_too=True)
    with pytest.raises(DataError, match="test-half"):
        training_set(DataConfig(kind="luna1", path=str(root), test_fraction=0.25, val_fraction=0.25, frame_views=True))


def _orbit_builds(boxed_world, tmp_path):
    """A tiny Luna-1 build of the procedural world, a training orbit of its training half and a
    validation orbit of its validation half."""
    from trn.data.datasets.annotate import AnnotateConfig
    from trn.data.datasets.build import BuildConfig, build_luna1, validation_segments
    from trn.data.worlds.render import RenderConfig

    base = dict(source=boxed_world, workers=1, render=RenderConfig(nav_size=64, crater_size=48),
                annotate=AnnotateConfig(min_box_px=4))
    build_luna1(BuildConfig(out=tmp_path / "main", render_frames=False, **base))
    build_luna1(BuildConfig(out=tmp_path / "train_orbit", segments=validation_segments(6, 3.75, 1.9),
                            annotate_training_of=tmp_path / "main", parts="scenarios", **base))
    build_luna1(BuildConfig(out=tmp_path / "val_orbit", segments=validation_segments(12),
                            annotate_validation_of=tmp_path / "main", parts="scenarios", **base))
    return tmp_path / "main", tmp_path / "train_orbit", tmp_path / "val_orbit"


def test_training_orbits_give_navigation_pairs_and_validate_on_the_validation_orbit(boxed_world, tmp_path):
    from trn.sim.scenarios import ScenarioSettings
    from trn.train.orbits import OrbitViews, numpy_rng, orbit_prefix

    main, train_orbit, val_orbit = _orbit_builds(boxed_world, tmp_path)
    doc = base_doc(main)
    doc["data"] = {"kind": "luna1", "path": str(main), "orbits": [str(train_orbit)], "val_orbit": str(val_orbit)}
    doc["model"] = dict(doc["model"], input_norm="disk", crop_margin=1.25)
    doc.update(epochs=2, batch_size=8, select="orbit", orbit_per_batch=3, decision={"weight": 1.0})
    cfg = from_dict(doc)
    # the orbit's craters are training identities of the main build, with no prefix
    assert orbit_prefix(train_orbit, [str(main)]) == ""
    with pytest.raises(ConfigError, match="annotate-training-of"):
        orbit_prefix(val_orbit, [str(main)])
    from trn.train.data import training_set

    ls, split = training_set(cfg.data)
    views = OrbitViews([(train_orbit, "")], split.train, 32, 1.25, ScenarioSettings(), max_gap=5)
    i = next(k for k, b in enumerate(views.boxes) if b)
    g = torch.Generator().manual_seed(0)
    a, b = views.pair(i, numpy_rng(g))
    assert a.segment == b.segment and abs(a.number - b.number) <= 5
    x, angles = views.crops([a, b], numpy_rng(g))
    assert x.shape == (2, 1, 32, 32) and ((angles >= 15) & (angles <= 345)).all()
    # the same seed gives the same crops
    g = torch.Generator().manual_seed(0)
    numpy_rng(g)
    assert torch.equal(views.crops([a, b], numpy_rng(g))[0], x)
    # a box of a crater outside the run's training identities is refused, never trained on
    from trn.errors import DataError

    with pytest.raises(DataError, match="not a training identity"):
        OrbitViews([(train_orbit, "")], split.val, 32, 1.25, ScenarioSettings())
    state = train(cfg, tmp_path / "run")
    rec = state.history[-1]
    for key in ("val_orbit_same", "val_orbit_same_cosine", "decision_loss"):
        assert key in rec and np.isfinite(rec[key])
    assert 0.0 <= rec["val_orbit_same"] <= 1.0
    assert "val_orbit_impostor" in rec  # NaN where no frame holds two craters, as in this tiny orbit
    m = load_descriptor(tmp_path / "run" / "weights.pt")
    assert m.cfg.input_norm == "disk" and m.cfg.crop_margin == 1.25
    with pytest.raises(ConfigError, match="val_orbit"):
        from_dict(dict(doc, data=dict(doc["data"], val_orbit="")))
    # part tokens trained with the descriptor, from that descriptor (which has no part head)
    joint = dict(doc, epochs=1, init=str(tmp_path / "run" / "weights.pt"),
                 model=dict(doc["model"], part_dim=8, part_hidden=16, part_edge_px=20, part_offset=0.1),
                 parts={"weight": 1.0})
    state = train(from_dict(joint), tmp_path / "joint")
    assert np.isfinite(state.history[-1]["part_loss"]) and state.history[-1]["part_loss"] > 0
    jm = load_descriptor(tmp_path / "joint" / "weights.pt")
    assert jm.parts is not None and jm.cfg.part_edge_px == 20 and jm.cfg.part_offset == 0.1
    with pytest.raises(ConfigError, match="part_dim"):
        from_dict(dict(doc, parts={"weight": 1.0}))  # no part head to train
    with pytest.raises(ConfigError, match="architecture differs"):
        train(from_dict(dict(joint, model=dict(joint["model"], embed_dim=16))), tmp_path / "other")


def test_orbit_batches_add_the_orbit_identities_in_shuffled_passes():
    from trn.train.data import orbit_batches

    g = torch.Generator().manual_seed(0)
    batches = [torch.arange(k * 4, k * 4 + 4) for k in range(5)]
    out = orbit_batches(batches, [100, 101, 102], 2, g)
    assert [len(b) for b in out] == [6] * 5
    assert all(torch.equal(o[:4], b) for o, b in zip(out, batches))
    extra = torch.cat([o[4:] for o in out]).tolist()
    # ten slots over three identities: three full passes and one more, each pass a permutation
    assert sorted(extra[:9]) == [100] * 3 + [101] * 3 + [102] * 3 and all(set(extra[i:i + 3]) == {100, 101, 102}
                                                                         for i in (0, 3, 6))
    assert orbit_batches(batches, [], 2, g) == batches


def test_proxies_start_at_the_init_models_embeddings(tmp_path):
    from trn.train.data import ImageBank, load_landmarks
    from trn.train.loop import _proxies_from_model, embed
    from trn.train.losses import MetricLoss

    root = tiny_folder(tmp_path / "f", n=10)
    cfg = from_dict(base_doc(root))
    ls = load_landmarks(cfg.data)
    bank = ImageBank(ls, ls.instances, 32)
    torch.manual_seed(0)
    from trn.models.descriptor import Descriptor

    model = Descriptor(cfg.model).eval()
    loss = MetricLoss("proxy-anchor", num_classes=len(bank), embedding_size=cfg.model.embed_dim)
    _proxies_from_model(model, bank, loss)
    want = embed(model, bank.images[[bank.views[i][0] for i in range(len(bank))]])
    torch.testing.assert_close(loss.loss.proxies.detach(), want)
    with pytest.raises(ConfigError, match="init_proxies"):
        from_dict(dict(base_doc(root), init_proxies=True))  # no init model to start from
    with pytest.raises(ConfigError, match="init_proxies"):
        from_dict(dict(base_doc(root), init_proxies=True, init="x.pt", loss="supcon"))


def test_a_drawn_frame_edge_cuts_the_crater_as_the_frame_would():
    from trn.data.views.crops import square_crop
    from trn.train.orbits import cut_by_edge

    frame = np.arange(200 * 300, dtype=np.float32).reshape(200, 300)
    box = (100, 160, 50, 110)  # 60 x 60 px, whole in the frame
    sides = set()
    for seed in range(64):
        window, (l, r, t, b) = cut_by_edge(frame, box, np.random.default_rng(seed))
        h, w = window.shape
        # the box now touches one edge of the window, on one axis only
        touches = [l == 0, r == w, t == 0, b == h]
        assert sum(touches) == 1
        sides.add(touches.index(True))
        # at least half of the crater's extent is kept on the cut axis, all of it on the other
        assert min(r - l, b - t) >= 30 and max(r - l, b - t) == 60
        # the window is the frame's own pixels, and the box within it is the part of the crater's
        # box on the window's side of the edge (the far side unchanged)
        oy, ox = divmod(int(window[0, 0]), 300)
        assert np.array_equal(window, frame[oy:oy + h, ox:ox + w])
        moved = (l + ox, r + ox, t + oy, b + oy)
        assert 100 <= moved[0] < moved[1] <= 160 and 50 <= moved[2] < moved[3] <= 110
        assert sum(m == o for m, o in zip(moved, box)) == 3
        # the crop is cut at the drawn edge as at a frame edge (mirrored there)
        assert square_crop(window, (l, r, t, b), 1.25).shape == (75, 75)
    assert sides == {0, 1, 2, 3}
    # a box too small to cut stays whole
    window, small = cut_by_edge(frame, (10, 15, 10, 15), np.random.default_rng(0))
    assert window is frame and small == (10, 15, 10, 15)


def test_orbit_edge_cut_needs_training_orbits_and_a_share(tmp_path):
    doc = base_doc(tmp_path)
    with pytest.raises(ConfigError, match="orbit_edge_cut cuts training-orbit views"):
        from_dict(dict(doc, orbit_edge_cut=0.5))
    with pytest.raises(ConfigError, match="orbit_edge_cut=1.5"):
        from_dict(dict(doc, orbit_edge_cut=1.5))
