"""The latency model against published measurements, its predictions for the flight models on
every timing profile, and (``--measure``) this machine's measured latencies beside the model's.

    python benchmarks/hardware/latency_model.py [--models export/flight_conv2d_se/model_int8.tflite ...] \
        [--shipped] [--measure] [--threads 1] [--out docs/benchmarks/hardware/latency_model.json]

1. Builds the reference networks (:mod:`trn.hw.zoo`: MobileNet v1 / v2, Inception v4, ResNet-50,
   ResNeXt-101 f) as int8 TFLite with random weights, through the project's own writer.
2. Fits the Edge TPU's efficiency and per-operator cost and each host's invoke cost and link rate
   on the calibration figures of :mod:`trn.hw.reference` by bounded least squares (no link rate
   above its profile's ``ceiling_mb_s``, efficiency at most 1, costs at least 0), solves the
   single-figure calibrations of the paper's platforms, and checks that the profiles under
   ``hw/profiles`` hold those numbers (the profiles are what every prediction uses).
3. Prints every published figure beside its prediction, calibration and validation rows marked,
   and a leave-one-out check over every Coral figure (each predicted by a bounded fit without it).
4. Predicts every ``--models`` TFLite file (the flight models' int8 backbones, with the 512-d head
   on the host) on every profile: per landmark, and per frame of 10 landmarks searched in a
   5,000-landmark database.
5. ``--measure``: times the reference networks and the ``--models`` files on this CPU with the
   TFLite interpreter (p50 / p95 / p99 / max after warm-up), fits a CPU-only profile of this
   machine (int8 rate, memory rate, per-operator and invoke costs) on three reference networks and
   a micro-graph of 400 element-wise operators only and compares its predictions for the flight
   models with their measured latency. Threads are pinned as the board agent pins them: one BLAS
   thread (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS = 1, set before numpy loads) and
   ``--threads`` interpreter threads (1 by default, the agent's). Both cores should be otherwise idle;
   the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

# one BLAS thread, as the board agent runs its numpy head; set before numpy is imported
PINNED = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
os.environ.update(PINNED)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _hw import hardware  # noqa: E402

from trn.export.tflite_format import read_tflite  # noqa: E402
from trn.hw import zoo  # noqa: E402
from trn.hw.latency import Observation, cpu_prediction, features, fit, fit_cpu, predict  # noqa: E402
from trn.hw.profiles import all_profiles, load_accelerator  # noqa: E402
from trn.hw.reference import EMBED_DIM, PUBLISHED  # noqa: E402

FRAME_LANDMARKS, DB_SIZE = 10, 5000


def _coral_fit(rows, feats, acc, profiles) -> dict:
    obs = [Observation(r.network, r.profile, r.ms, feats[r.network]) for r in rows]
    ceilings = {r.profile: profiles[r.profile].l("ceiling_mb_s") for r in rows}
    return fit(obs, acc["peak_int8_tops"], int(acc["usable_cache_bytes"]), ceilings)


def _fitted_prediction(res: dict, f, profile: str, acc) -> float:
    h = res["hosts"][profile]
    streamed = max(0, f.param_bytes - int(acc["usable_cache_bytes"]))
    return (h["invoke_ms"] + (f.transfer_bytes + streamed) / (h["bandwidth_mb_s"] * 1e6) * 1e3
            + 2.0 * f.mapped_macs / (acc["peak_int8_tops"] * 1e12 * res["efficiency"]) * 1e3
            + f.mapped_ops * res["per_op_us"] * 1e-3)


def _with(profile, where: str, key: str, value: float, acc=None):
    """``profile`` with one quantity replaced (and the accelerator, when given)."""
    part = dict(getattr(profile, where))
    part[key] = replace(part[key], value=float(value))
    return replace(profile, **{where: part}, accelerator=acc or profile.accelerator)


def _solve_rate(info, profile, where: str, key: str, target_ms: float, r) -> float:
    """The rate (a link's MB/s or a host's GFLOPS) at which the prediction equals ``target_ms``:
    the prediction is c + k / rate, so two evaluations determine it."""
    def t(v):
        return predict(info, _with(profile, where, key, v), EMBED_DIM if r.head else 0, r.precision).per_landmark_ms

    r1, r2 = 1.0, 2.0
    t1, t2 = t(r1), t(r2)
    k = (t1 - t2) / (1 / r1 - 1 / r2)
    c = t1 - k / r1
    if target_ms <= c:
        raise RuntimeError(f"{profile.name}: {target_ms} ms is below the rate-independent {c:.1f} ms")
    return k / (target_ms - c)


def _expected_profiles(res: dict, profiles: dict, infos: dict, acc) -> dict:
    """What the fit and the single-figure calibrations put in each profile: {(profile, field): value}.
    The accelerator's fitted numbers first, then each Coral host's, then the platforms derived from
    them (their ``source`` says how), then the paper's single-figure platforms solved with them."""
    exp = {("coral-edge-tpu", "efficiency"): res["efficiency"], ("coral-edge-tpu", "per_op_us"): res["per_op_us"]}
    for host, v in res["hosts"].items():
        exp[(host, "host.invoke_ms")] = v["invoke_ms"]
        exp[(host, "link.bandwidth_mb_s")] = v["bandwidth_mb_s"]
    usb2, usb3 = res["hosts"]["rpi3bplus-coral-usb2"], res["hosts"]["rpi4-coral-usb3"]
    exp[("pynq-z2-coral-usb2", "link.bandwidth_mb_s")] = usb2["bandwidth_mb_s"]
    exp[("pynq-z2-coral-usb2", "host.invoke_ms")] = usb2["invoke_ms"] * 1.4 / 0.65
    exp[("spacecube-v3-t2080-sclearn", "host.invoke_ms")] = usb3["invoke_ms"]
    fields = dict(acc.fields)
    for k in ("efficiency", "per_op_us"):
        fields[k] = replace(fields[k], value=res[k])
    fitted_acc = replace(acc, fields=fields)
    for r in PUBLISHED:
        if r.role != "calibration" or r.network != "resnext101":
            continue
        prof = profiles[r.profile]
        if prof.accelerator is not None:
            prof = replace(prof, accelerator=fitted_acc)
            exp[(r.profile, "link.bandwidth_mb_s")] = _solve_rate(infos[r.network], prof, "link", "bandwidth_mb_s",
                                                                  r.ms, r)
        else:
            exp[(r.profile, "host.fp32_gflops")] = _solve_rate(infos[r.network], prof, "host", "fp32_gflops", r.ms, r)
    return exp


def _profile_value(profiles: dict, acc, name: str, field: str) -> float:
    if name == "coral-edge-tpu":
        return acc[field]
    where, key = field.split(".")
    return profiles[name].h(key) if where == "host" else profiles[name].l(key)


def _time(fn, warmup: int, n: int) -> dict:
    """Wall-clock p50 / p95 / p99 / max (ms) after ``warmup`` calls, and the same of the calling
    thread's CPU time (``cpu_*``): with one interpreter thread and one BLAS thread the inference
    runs on this thread, so its CPU time is the latency without the time other processes held the
    core (wall time on a loaded machine is not)."""
    for _ in range(warmup):
        fn()
    t, c = np.empty(n), np.empty(n)
    for i in range(n):
        c0, t0 = time.thread_time(), time.perf_counter()
        fn()
        t[i] = (time.perf_counter() - t0) * 1e3
        c[i] = (time.thread_time() - c0) * 1e3
    out = {}
    for prefix, v in (("", t), ("cpu_", c)):
        out |= {f"{prefix}p50": float(np.percentile(v, 50)), f"{prefix}p95": float(np.percentile(v, 95)),
                f"{prefix}p99": float(np.percentile(v, 99)), f"{prefix}max": float(v.max())}
    return out


def _interp(path: Path, threads: int, head: bool):
    """A function running one inference (with the host head for the flight models)."""
    if head:
        from trn.export.tflite import Head, TfliteRunner

        hp = path.parent / "head.npz"
        r = TfliteRunner(path, Head.load(hp) if hp.exists() else None, threads)
        x = np.random.default_rng(0).random((1, r.input_size, r.input_size), dtype=np.float32)
        return lambda: r(x)
    from trn.export.tflite import load_interpreter

    it = load_interpreter(path, threads)
    it.allocate_tensors()
    d = it.get_input_details()[0]
    it.set_tensor(d["index"], np.random.default_rng(0).integers(-128, 128, d["shape"], dtype=np.int8))
    return it.invoke


def _shipped(out: Path) -> list[Path]:
    """Timing-only int8 TFLite backbones of the shipped models (models/<name>/weights.pt)."""
    from trn.models.registry import MODELS_DIR
    from trn.sim.embedders import TorchEmbedder
    from trn.sim.timing import write_timing_tflite
    from trn.models.checkpoint import load_descriptor

    paths = []
    for w in sorted(Path(MODELS_DIR).glob("*/weights.pt")):
        target = out / w.parent.name / "model_int8.tflite"
        if not target.exists():
            write_timing_tflite(TorchEmbedder(load_descriptor(w), w.parent.name), target)
        paths.append(target)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", type=Path, default=[], help="int8 TFLite backbones of flight models")
    ap.add_argument("--shipped", action="store_true",
                    help="also every shipped model under models/, lowered now for timing (the operators and "
                         "parameter bytes of its trn-export tflite file; activation ranges fixed, not calibrated)")
    ap.add_argument("--measure", action="store_true", help="also time everything on this CPU")
    ap.add_argument("--threads", nargs="+", type=int, default=[1],
                    help="interpreter threads (the board agent runs 1); BLAS is always pinned to one thread")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--n", type=int, default=100, help="timed inferences per file and thread count")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="what the CPU profile is fitted on and validated against: wall-clock p50, or the p50 of "
                         "the inference thread's CPU time (one interpreter thread only; for a machine whose cores "
                         "other jobs share)")
    ap.add_argument("--zoo", type=Path, default=Path("runs/zoo"), help="where the reference networks are written")
    ap.add_argument("--out", type=Path, default=None, help="write every figure as JSON here")
    args = ap.parse_args()
    print(f"hardware: {hardware()}")
    print("threads: " + ", ".join(f"{k}={os.environ[k]}" for k in PINNED) + f"; interpreter threads {args.threads}; "
          f"load average {os.getloadavg()[0]:.2f} at the start")
    record: dict = {"hardware": hardware(), "pinned": {k: os.environ[k] for k in PINNED},
                    "interpreter_threads": args.threads, "load_average_start": os.getloadavg()}

    feats, infos = {}, {}
    for name in zoo.ZOO:
        p = zoo.build(name, args.zoo)
        infos[name] = read_tflite(p)
        feats[name] = features(infos[name])
        f = feats[name]
        print(f"  {name:13s} {f.mapped_ops:5d} ops {f.mapped_macs / 1e9:6.2f} GMAC {f.param_bytes / 2 ** 20:6.2f} MiB "
              f"parameters  ({zoo.ZOO[name][1]})")
    acc = load_accelerator("coral-edge-tpu")
    profiles = {p.name: p for p in all_profiles()}

    # 2. the Coral calibration, the paper's single-figure calibrations, and the profiles checked
    coral = [r for r in PUBLISHED if profiles[r.profile].accelerator is not None and r.network != "resnext101"]
    res = _coral_fit([r for r in coral if r.role == "calibration"], feats, acc, profiles)
    print(f"\nEdge TPU fit on {sum(r.role == 'calibration' for r in coral)} Coral figures (bounded least squares): "
          f"efficiency {res['efficiency']:.4f}, per operator {res['per_op_us']:.2f} us")
    for host, v in res["hosts"].items():
        at = " (at the ceiling)" if host in res["at_ceiling"] else ""
        print(f"  {host:24s} invoke {v['invoke_ms']:.3f} ms, link {v['bandwidth_mb_s']:.1f} MB/s of at most "
              f"{v['ceiling_mb_s']:g}{at}")
    expected = _expected_profiles(res, profiles, infos, acc)
    mismatch = []
    for (name, fld), want in expected.items():
        got = _profile_value(profiles, acc, name, fld)
        if abs(got - want) > 0.002 * max(abs(want), 0.05):
            mismatch.append(f"{name} {fld}: profile {got}, expected {want:.4g}")
    print(f"profiles agree with the fit ({len(expected)} values)" if not mismatch
          else "PROFILES DIFFER FROM THE FIT: " + "; ".join(mismatch))
    record["fit"] = res
    record["expected_profile_values"] = {f"{n} {f}": v for (n, f), v in expected.items()}
    record["profile_mismatch"] = mismatch

    # 3. every published figure beside the profiles' prediction, and leave-one-out
    print("\n| network | platform | role | predicted ms | published ms | error |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    rows = []
    for r in PUBLISHED:
        pr = predict(infos[r.network], profiles[r.profile], EMBED_DIM if r.head else 0, r.precision)
        err = pr.per_landmark_ms / r.ms - 1
        rows.append({"network": r.network, "profile": r.profile, "role": r.role, "predicted_ms": pr.per_landmark_ms,
                     "published_ms": r.ms, "error": err, "parts": pr.parts, "source": r.source})
        print(f"| {r.network} | {r.profile} | {r.role} | {pr.per_landmark_ms:.2f} | {r.ms:.6g} | {err * 100:+.1f} % |")
    record["published"] = rows
    print("\nleave-one-out over the Coral figures (each predicted by a bounded fit on the others):")
    print("| network | platform | predicted ms | published ms | error | link of the fit without it |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    loo = []
    for r in coral:
        rr = _coral_fit([o for o in coral if o is not r], feats, acc, profiles)
        p = _fitted_prediction(rr, feats[r.network], r.profile, acc)
        h = rr["hosts"][r.profile]
        link = f"{h['bandwidth_mb_s']:.1f} MB/s" + (" (at the ceiling)" if r.profile in rr["at_ceiling"] else "")
        loo.append({"network": r.network, "profile": r.profile, "predicted_ms": p, "published_ms": r.ms,
                    "error": p / r.ms - 1, "bandwidth_mb_s": h["bandwidth_mb_s"],
                    "at_ceiling": r.profile in rr["at_ceiling"]})
        print(f"| {r.network} | {r.profile} | {p:.2f} | {r.ms:.6g} | {(p / r.ms - 1) * 100:+.1f} % | {link} |")
    worst = max(loo, key=lambda x: abs(x["error"]))
    print(f"largest leave-one-out error: {worst['error'] * 100:+.1f} % ({worst['network']} on {worst['profile']}), "
          f"over all {len(loo)} Coral figures")
    record["leave_one_out"] = loo

    # 4. the flight models on every profile
    if args.shipped:
        args.models = list(args.models) + _shipped(args.zoo)
    flight = {}
    if args.models:
        print(f"\nflight models: per landmark, and per frame of {FRAME_LANDMARKS} landmarks searched in a "
              f"{DB_SIZE:,}-landmark database (ms)")
        print("| model | profile | per landmark | streamed MiB | per frame | 10 s cadence |")
        print("| --- | --- | ---: | ---: | ---: | --- |")
        for path in args.models:
            info = read_tflite(path)
            for prof in profiles.values():
                pr = predict(info, prof, EMBED_DIM, "int8")
                fr = pr.frame_ms(FRAME_LANDMARKS, DB_SIZE)
                flight.setdefault(str(path), {})[prof.name] = {**pr.to_dict(), "frame": fr}
                print(f"| {path.parent.name} | {prof.name} | {pr.per_landmark_ms:.2f} | {pr.streamed_bytes / 2 ** 20:.2f} "
                      f"| {fr['total_ms']:.1f} | {'yes' if fr['total_ms'] < 10_000 else 'NO'} |")
    record["flight"] = flight

    # 5. this machine
    if args.measure:
        measured: dict = {}
        print("\nthis machine, TFLite interpreter (XNNPACK), ms:")
        if args.clock == "cpu" and args.threads != [1]:
            raise SystemExit("--clock cpu needs --threads 1: with more threads the inference is not on this thread")
        key = "p50" if args.clock == "wall" else "cpu_p50"
        record["clock"] = args.clock
        print(f"fitted and validated on: {'wall-clock' if args.clock == 'wall' else 'CPU time of the inference thread'}"
              " p50")
        print("| graph | threads | p50 | p95 | p99 | max | CPU-time p50 | predicted | p50 with the host head |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        calib = ("mobilenet_v1", "mobilenet_v2", "resnet50", "eltwise_chain", "mobilenet_v1_96", "resnet50_96")
        graphs = [(n, zoo.build(n, args.zoo), False) for n in calib]
        zoo_dir = args.zoo.resolve()
        graphs += [(f"{p.parent.name} (lowered for timing)" if zoo_dir in p.resolve().parents else
                    f"{p.parent.name}/{p.name}", p, True) for p in args.models]
        feats_cpu = {name: features(read_tflite(path), accelerated=False) for name, path, _ in graphs}
        for threads in args.threads:
            for name, path, head in graphs:
                # the interpreter alone, like the calibration graphs: the prediction is the backbone's
                measured.setdefault(str(threads), {})[name] = _time(_interp(path, threads, False), args.warmup, args.n)
                if head and (path.parent / "head.npz").exists():  # the host head (numpy, one BLAS thread), timed apart
                    measured[str(threads)][name]["with_host_head"] = _time(_interp(path, threads, True), args.warmup,
                                                                           args.n)
            obs = []
            for name, path, head in graphs[:len(calib)]:
                f = feats_cpu[name]
                obs.append((f.host_macs, f.host_act_bytes, f.host_ops, measured[str(threads)][name][key]))
            cpu = fit_cpu(obs)
            measured[str(threads)]["fit"] = cpu
            for name, path, head in graphs:
                pred = cpu_prediction(cpu, feats_cpu[name])
                m = measured[str(threads)][name]
                m["predicted_ms"] = pred
                role = "calibration" if not head else "validation"
                hh = f"{m['with_host_head'][key]:.2f}" if "with_host_head" in m else "-"
                print(f"| {name} ({role}) | {threads} | {m['p50']:.2f} | {m['p95']:.2f} | {m['p99']:.2f} | {m['max']:.2f} "
                      f"| {m['cpu_p50']:.2f} | {pred:.2f} ({(pred / m[key] - 1) * 100:+.1f} %) | {hh} |")
            print(f"  fit at {threads} thread(s): {cpu['gops']:.1f} int8 GOPS, {cpu['memory_gb_s']:.2f} GB/s, "
                  f"{cpu['per_op_us']:.2f} us per operator, invoke {cpu['invoke_ms']:.3f} ms")
        record["measured"] = measured
    record["load_average_end"] = os.getloadavg()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1, default=float) + "\n", encoding="utf-8")
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
