"""Timing profiles (strict loading) and the latency model against hand-computed cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tflite")

from trn.errors import ConfigError  # noqa: E402
from trn.export.tflite_format import read_tflite, write_tflite  # noqa: E402
from trn.hw.latency import Observation, features, fit, fit_cpu, predict  # noqa: E402
from trn.hw.profiles import all_profiles, load_profile  # noqa: E402
from trn.hw.zoo import Builder  # noqa: E402

ACC = """\
name: test-tpu
title: a test accelerator
peak_int8_tops: {value: 1.0, kind: published, source: "s"}
efficiency: {value: 0.5, kind: calibrated, source: "s"}
per_op_us: {value: 10.0, kind: calibrated, source: "s"}
cache_bytes: {value: 200000, kind: published, source: "s"}
usable_cache_bytes: {value: CACHE, kind: published, source: "s"}
"""

HOST = """\
name: NAME
title: a test board
stands_for: nothing
host:
  cores: {value: 1, kind: published, source: "s"}
  clock_ghz: {value: 1.0, kind: published, source: "s"}
  int8_gops: {value: 2.0, kind: assumed, source: "s"}
  fp32_gflops: {value: 1.0, kind: assumed, source: "s"}
  memory_gb_s: {value: 1000.0, kind: assumed, source: "s"}
  per_op_us: {value: 100.0, kind: assumed, source: "s"}
  invoke_ms: {value: 1.0, kind: calibrated, source: "s"}
"""

LINK = """\
link:
  name: a wire
  signalling_mbit_s: {value: 480, kind: published, source: "s"}
  ceiling_mb_s: {value: 53.2, kind: published, source: "s"}
  bandwidth_mb_s: {value: 1.0, kind: calibrated, source: "s"}
accelerator: test-tpu
"""


def _profile(tmp_path: Path, cache: int = 1000, accelerated: bool = True, name: str = "board"):
    (tmp_path / "accelerators").mkdir(exist_ok=True)
    (tmp_path / "accelerators" / "test-tpu.yaml").write_text(ACC.replace("CACHE", str(cache)))
    (tmp_path / f"{name}.yaml").write_text(HOST.replace("NAME", name) + (LINK if accelerated else ""))
    return load_profile(name, tmp_path)


def _one_conv(tmp_path: Path, gather: bool = False) -> Path:
    """input [1, 8, 8, 4] -> CONV_2D 3x3 to 16 channels (36,864 MACs, 576 + 64 parameter bytes)
    [-> GATHER of 16 channels -> CONV_2D 1x1 to 8 channels (8,192 MACs)]."""
    b = Builder(8, 4, seed=0)
    x = b.conv(b.input, 16, 3, act="RELU")
    if gather:
        idx = b.g.const("idx", np.arange(16)[::-1].copy(), "param")
        x = b.g.op("GATHER", [x, idx], (1, 8, 8, 16), "gather", axis=3)
        x = b.conv(x, 8, 1, act="NONE")
    g = b.finish(x)
    return write_tflite(g, tmp_path / f"net{int(gather)}.tflite", quantized=True)


def test_shipped_profiles_load_with_sources():
    profs = all_profiles()
    names = {p.name for p in profs}
    assert {"pynq-z2-coral-usb2", "kcu105-microblaze-sclearn", "kcu105-rocket-sclearn", "laptop-i9-12900hk",
            "x86-coral-usb3", "x86-xeon6154-coral-usb3", "rpi4-coral-usb3", "rpi3bplus-coral-usb2",
            "spacecube-v2-ppc440", "spacecube-v3-t2080-sclearn"} <= names
    for p in profs:
        for key, q in p.quantities():
            assert q.kind in ("published", "calibrated", "assumed") and q.source.strip(), (p.name, key)
        if p.link is not None:  # no link faster than its bus (the loader refuses it; the shipped ones agree)
            assert p.l("bandwidth_mb_s") <= p.l("ceiling_mb_s") <= p.l("signalling_mbit_s") / 8, p.name


def test_every_published_figure_has_one_host_per_profile_and_an_exact_source():
    """The x86 profile once mixed pycoral's Xeon E5-1650 v3 with coral.ai's Xeon Gold 6154: each
    profile's figures now come from one host, which its title names, and every source names the
    file and line (pycoral) or the table column and row (coral.ai) it was read from."""
    from trn.hw.reference import PUBLISHED

    profiles = {p.name: p for p in all_profiles()}
    by_profile: dict[str, set[str]] = {}
    for r in PUBLISHED:
        by_profile.setdefault(r.profile, set()).add(r.host)
        assert r.host in profiles[r.profile].title, (r.profile, r.host)
        if "pycoral" in r.source:
            assert "benchmarks/reference/inference_reference_" in r.source and ", line " in r.source, r.source
            assert "(host: " in r.source
        elif "coral.ai" in r.source:
            assert "column 'Desktop CPU + USB Accelerator (USB 3.0) with Edge TPU', row '" in r.source
    assert all(len(h) == 1 for h in by_profile.values()), by_profile
    pycoral_hosts = {r.profile for r in PUBLISHED if "pycoral" in r.source}
    page_hosts = {r.profile for r in PUBLISHED if "coral.ai" in r.source}
    assert pycoral_hosts and page_hosts and not pycoral_hosts & page_hosts


def test_fits_the_cache_by_hand(tmp_path):
    prof = _profile(tmp_path, cache=1000)
    pr = predict(_one_conv(tmp_path), prof)
    macs = 8 * 8 * 16 * 9 * 4
    assert pr.macs == macs and pr.streamed_bytes == 0 and pr.mapped_ops == 1 and pr.host_ops == 0
    expect = {"invoke": 1.0, "transfer": (256 + 1024) / 1e6 * 1e3, "streamed_parameters": 0.0,
              "accelerator_compute": 2 * macs / (1e12 * 0.5) * 1e3, "accelerator_ops": 10e-3, "host_ops": 0.0}
    assert pr.parts == pytest.approx(expect)
    assert pr.per_landmark_ms == pytest.approx(sum(expect.values()))


def test_streams_what_the_cache_does_not_hold(tmp_path):
    prof = _profile(tmp_path, cache=100)
    pr = predict(_one_conv(tmp_path), prof)
    params = 16 * 3 * 3 * 4 + 16 * 4  # int8 kernel + int32 bias
    assert pr.streamed_bytes == params - 100
    assert pr.parts["streamed_parameters"] == pytest.approx((params - 100) / 1e6 * 1e3)


def test_cpu_fallback_after_an_unmapped_operator(tmp_path):
    prof = _profile(tmp_path, cache=100_000)
    path = _one_conv(tmp_path, gather=True)
    f = features(read_tflite(path))
    assert (f.mapped_ops, f.host_ops) == (1, 2)
    assert f.transfer_bytes == 256 + 1024  # the input, and the conv output crossing to the host
    pr = predict(path, prof)
    host_macs = 8 * 8 * 8 * 16
    act = (1024 + 1024) + (1024 + 512)  # GATHER in and out, the 1x1 conv in and out (int8)
    assert f.host_act_bytes == act
    assert pr.parts["host_ops"] == pytest.approx(2 * host_macs / 2e9 * 1e3 + act / 1000e9 * 1e3 + 2 * 100e-3)
    assert pr.parts["accelerator_ops"] == pytest.approx(10e-3)


def test_cpu_only_profile_and_frame_time(tmp_path):
    prof = _profile(tmp_path, accelerated=False)
    pr = predict(_one_conv(tmp_path), prof, embed_dim=4, precision="fp32")
    macs = 8 * 8 * 16 * 9 * 4  # fp32: counted as written (int8 kernels pad the depth to 8)
    assert set(pr.parts) == {"invoke", "host_ops", "host_head"}
    assert pr.parts["host_ops"] == pytest.approx(2 * macs / 1e9 * 1e3 + (256 + 1024) / 1000e9 * 1e3 + 100e-3)
    fr = pr.frame_ms(landmarks=3, db_size=1000)
    assert fr["search_ms"] == pytest.approx(3 * 2 * 1000 * 4 / 1e9 * 1e3)
    assert fr["total_ms"] == pytest.approx(3 * pr.per_landmark_ms + fr["search_ms"])
    with pytest.raises(ConfigError, match="precision"):
        predict(_one_conv(tmp_path), prof, precision="fp16")


def test_fit_recovers_known_parameters(tmp_path):
    from trn.hw.latency import Features

    rng = np.random.default_rng(0)
    truth = {"eff": 0.3, "per_op": 12.0, "h": {"a": (1.5, 300.0), "b": (4.0, 30.0)}}
    obs = []
    for host, (inv, bw) in truth["h"].items():
        for _ in range(4):
            f = Features(int(rng.integers(20, 200)), int(rng.integers(1e8, 1e10)), int(rng.integers(1e5, 3e5)),
                         int(rng.integers(1e6, 4e7)), 0, 0)
            streamed = max(0, f.param_bytes - 5_000_000)
            ms = inv + (f.transfer_bytes + streamed) / (bw * 1e6) * 1e3 + 2 * f.mapped_macs / (4e12 * 0.3) * 1e3 \
                + f.mapped_ops * 12.0 * 1e-3
            obs.append(Observation("n", host, ms, f))
    res = fit(obs, 4.0, 5_000_000)
    assert res["efficiency"] == pytest.approx(0.3, rel=1e-6)
    assert res["per_op_us"] == pytest.approx(12.0, rel=1e-6)
    for host, (inv, bw) in truth["h"].items():
        assert res["hosts"][host]["invoke_ms"] == pytest.approx(inv, rel=1e-6)
        assert res["hosts"][host]["bandwidth_mb_s"] == pytest.approx(bw, rel=1e-6)
    with pytest.raises(ConfigError, match="observations"):
        fit(obs[:3], 4.0, 5_000_000)
    # bounded: a link "measured" faster than its bus is fitted at the bus's ceiling, never above
    res = fit(obs, 4.0, 5_000_000, {"a": 200.0, "b": 100.0})
    assert res["hosts"]["a"]["bandwidth_mb_s"] == pytest.approx(200.0) and res["at_ceiling"] == ["a"]
    assert res["hosts"]["b"]["bandwidth_mb_s"] < 100.0  # below its ceiling: a free parameter
    assert 0 < res["efficiency"] <= 1 and res["per_op_us"] >= 0
    # a host whose figures move almost no data is still determined: its link sits at the ceiling
    small = [Observation(o.network, "c", o.ms, Features(o.features.mapped_ops, o.features.mapped_macs, 1000,
                                                          1000, 0, 0)) for o in obs[:4]]
    res = fit(obs + small, 4.0, 5_000_000, {"a": 1e3, "b": 1e3, "c": 50.0})
    assert res["hosts"]["c"]["bandwidth_mb_s"] <= 50.0 * (1 + 1e-9)
    def ms(m, b, n):  # 5 GOPS, 2 GB/s, 20 us per operator, 0.5 ms per inference
        return 2 * m / 5e9 * 1e3 + b / 2e9 * 1e3 + n * 0.02 + 0.5

    graphs = [(1e9, 1e6, 10), (4e9, 3e7, 50), (2e8, 2e6, 200), (1e7, 5e7, 400), (3e9, 1e5, 30)]
    cpu = fit_cpu([(m, b, n, ms(m, b, n)) for m, b, n in graphs])
    assert cpu["gops"] == pytest.approx(5.0) and cpu["per_op_us"] == pytest.approx(20.0)
    assert cpu["memory_gb_s"] == pytest.approx(2.0) and cpu["invoke_ms"] == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="at least 4"):
        fit_cpu([(m, b, n, ms(m, b, n)) for m, b, n in graphs[:3]])


def test_bounded_least_squares_matches_a_reference_solver():
    """``x >= lower`` least squares against scipy's bounded solver on random problems, some with
    active bounds."""
    lsq_linear = pytest.importorskip("scipy.optimize").lsq_linear
    from trn.hw.latency import bounded_lsq

    rng = np.random.default_rng(3)
    for _ in range(20):
        a = rng.normal(size=(9, 5))
        y = rng.normal(size=9)
        lower = rng.normal(size=5)
        want = lsq_linear(a, y, bounds=(lower, np.inf), method="bvls", tol=1e-12).x
        got = bounded_lsq(a, y, lower)
        assert np.all(got >= lower - 1e-12)
        assert np.sum((a @ got - y) ** 2) == pytest.approx(np.sum((a @ want - y) ** 2), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.replace("  cores:", "  cpus:"), r"unknown key\(s\) \['cpus'\] in host"),
    (lambda t: t.replace("  invoke_ms: {value: 1.0, kind: calibrated, source: \"s\"}\n", ""), r"missing key.*invoke_ms"),
    (lambda t: t.replace("kind: assumed", "kind: guessed", 1), r"kind is 'guessed'"),
    (lambda t: t.replace("clock_ghz: {value: 1.0", "clock_ghz: {value: -2"), r"out of range for core clock"),
    (lambda t: t.replace("clock_ghz: {value: 1.0", "clock_ghz: {value: fast"), r"clock_ghz.value must be a number"),
    (lambda t: t.replace('source: "s"}', 'source: ""}', 1), r"source must be a non-empty string"),
    (lambda t: t.replace("accelerator: test-tpu", "accelerator: tpu9"), r"unknown accelerator 'tpu9'"),
    (lambda t: t.replace("accelerator: test-tpu\n", ""), r"both link and accelerator"),
    (lambda t: t + "extra: 1\n", r"unknown key\(s\) \['extra'\] in the profile"),
    (lambda t: "[1, 2", r"not valid YAML"),
    (lambda t: t.replace("bandwidth_mb_s: {value: 1.0", "bandwidth_mb_s: {value: 686"),
     r"exceeds what the link can carry"),
    (lambda t: t.replace("ceiling_mb_s: {value: 53.2", "ceiling_mb_s: {value: 70"),
     r"ceiling_mb_s 70.* exceeds the signalling"),
    (lambda t: t.replace("  ceiling_mb_s: {value: 53.2, kind: published, source: \"s\"}\n", ""),
     r"missing key.*ceiling_mb_s"),
])
def test_profile_errors_name_file_and_field(tmp_path, edit, match):
    _profile(tmp_path)
    p = tmp_path / "board.yaml"
    p.write_text(edit(p.read_text()))
    with pytest.raises(ConfigError, match=match) as e:
        load_profile("board", tmp_path)
    if "unknown accelerator" not in match:
        assert "board.yaml" in str(e.value)


def test_unknown_profile_lists_the_available(tmp_path):
    _profile(tmp_path)
    with pytest.raises(ConfigError, match=r"unknown timing profile 'nope'.*\['board'\]"):
        load_profile("nope", tmp_path)


def test_accelerator_cache_checked(tmp_path):
    with pytest.raises(ConfigError, match="usable_cache_bytes exceeds"):
        _profile(tmp_path, cache=500_000)  # usable > cache 200,000


def test_reference_networks_match_published_sizes(tmp_path):
    """The zoo's architectures: parameter counts and MACs as published (MobileNet v1: 4.2 M
    parameters, 569 M MACs; v2: 3.5 M, 300 M)."""
    from trn.hw import zoo

    f1 = features(read_tflite(zoo.build("mobilenet_v1", tmp_path)))
    f2 = features(read_tflite(zoo.build("mobilenet_v2", tmp_path)))
    assert f1.mapped_macs == pytest.approx(569e6, rel=0.01) and f2.mapped_macs == pytest.approx(300e6, rel=0.01)
    assert f1.param_bytes == pytest.approx(4.2e6, rel=0.03)
    assert f2.param_bytes == pytest.approx(3.5e6, rel=0.03)


def test_cpu_macs_pad_a_convolution_input_depth_to_the_kernel_tile(tmp_path):
    """A 7x7 convolution over 1 input channel costs a CPU what one over 8 does (measured: XNNPACK
    pads the depth); the accelerator's and the arithmetic MAC counts stay unpadded."""
    from trn.hw.latency import CPU_CHANNEL_TILE, graph_costs

    paths = {}
    for cin in (1, 8, 9):
        b = Builder(16, cin, seed=0)
        paths[cin] = write_tflite(b.finish(b.conv(b.input, 4, 7, act="NONE")), tmp_path / f"c{cin}.tflite",
                                  quantized=True)
    f = {c: features(read_tflite(p), accelerated=False) for c, p in paths.items()}
    per_channel = 16 * 16 * 4 * 49
    assert CPU_CHANNEL_TILE == 8
    assert f[1].host_macs == f[8].host_macs == 8 * per_channel and f[9].host_macs == 16 * per_channel
    assert graph_costs(read_tflite(paths[1]), accelerated=False)[0].macs == per_channel
    assert features(read_tflite(paths[1])).mapped_macs == per_channel
