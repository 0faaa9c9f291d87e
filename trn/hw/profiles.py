"""Timing profiles of boards: ``hw/profiles/*.yaml`` (hosts with their link) and
``hw/profiles/accelerators/*.yaml``.

Every number is a quantity with its provenance::

    clock_ghz: {value: 0.65, kind: published, source: "TUL PYNQ-Z2 reference manual: 650 MHz"}

``kind`` is ``published`` (a figure from a datasheet, a paper or a vendor benchmark, cited in
``source`` with the host it was measured on), ``calibrated`` (fitted by
``python benchmarks/hardware/latency_model.py`` to the published latencies named in ``source``, within
physical bounds: no link rate above the link's ``ceiling_mb_s``) or ``assumed`` (an engineering
estimate whose reasoning is in ``source``). Loading is strict: unknown keys, missing keys, wrong
types, out-of-range values, unknown accelerators and a link rate above its ceiling are errors that
name the file and the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trn.errors import ConfigError

KINDS = ("published", "calibrated", "assumed")
PROFILE_DIR = Path(__file__).resolve().parents[2] / "hw" / "profiles"

# field: (description, lower bound (exclusive unless 0), upper bound)
HOST_FIELDS = {
    "cores": ("CPU cores", 1, 256),
    "clock_ghz": ("core clock, GHz", 0.0, 10.0),
    "int8_gops": ("effective int8 throughput of the host for operators that fall back to it, GOPS", 0.0, 1e5),
    "fp32_gflops": ("effective fp32 throughput: the head, the database search, CPU-only inference, GFLOPS", 0.0, 1e5),
    "memory_gb_s": ("effective memory bandwidth of the host for the activations of operators it runs, GB/s", 0.0, 1e4),
    "per_op_us": ("host runtime cost per operator it runs, microseconds", 0.0, 1e6),
    "invoke_ms": ("fixed host cost per inference (runtime and driver), milliseconds", 0.0, 1e6),
}
LINK_FIELDS = {
    "signalling_mbit_s": ("signalling rate of the link, Mbit/s", 0.0, 1e6),
    # the bound of the calibration: a fitted rate above what the bus can carry is a modelling
    # error (streaming that overlaps computation), not a faster bus
    "ceiling_mb_s": ("the most payload the link can carry, MB/s (1e6 bytes): at most signalling / 8", 0.0, 1e6),
    "bandwidth_mb_s": ("effective transfer rate in the additive model, MB/s (1e6 bytes): at most ceiling_mb_s",
                       0.0, 1e6),
}
ACCEL_FIELDS = {
    "peak_int8_tops": ("peak int8 throughput, TOPS", 0.0, 1e4),
    "efficiency": ("share of the peak reached on the reference networks", 0.0, 1.0),
    "per_op_us": ("cost per operator on the accelerator, microseconds", 0.0, 1e6),
    "cache_bytes": ("on-chip parameter memory, bytes", 0.0, 1e12),
    "usable_cache_bytes": ("parameter bytes the compiler caches before streaming the rest", 0.0, 1e12),
}


@dataclass(frozen=True)
class Quantity:
    value: float
    kind: str
    source: str


@dataclass(frozen=True)
class Accelerator:
    name: str
    title: str
    fields: dict[str, Quantity]

    def __getitem__(self, k: str) -> float:
        return self.fields[k].value


@dataclass(frozen=True)
class Profile:
    name: str
    title: str
    stands_for: str
    host: dict[str, Quantity]
    link: dict[str, Quantity] | None
    link_name: str | None
    accelerator: Accelerator | None
    path: Path

    def h(self, k: str) -> float:
        return self.host[k].value

    def l(self, k: str) -> float:  # noqa: E743 - the link's field
        if self.link is None:
            raise ConfigError(f"profile {self.name} has no link")
        return self.link[k].value

    def quantities(self) -> list[tuple[str, Quantity]]:
        out = [(f"host.{k}", q) for k, q in self.host.items()]
        out += [(f"link.{k}", q) for k, q in (self.link or {}).items()]
        if self.accelerator is not None:
            out += [(f"accelerator.{k}", q) for k, q in self.accelerator.fields.items()]
        return out


def _load_yaml(path: Path) -> dict:
    from trn.yamlio import load_yaml as _yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the profile ({exc.strerror})") from None
    try:
        d = _yaml(text)
    except Exception as exc:  # yaml.YAMLError and friends
        raise ConfigError(f"{path}: not valid YAML ({exc}); fix the file") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: a profile is a mapping of keys, got {type(d).__name__}")
    return d


def _keys(path: Path, where: str, d: dict, required: set[str], optional: set[str] = frozenset()) -> None:
    unknown = set(d) - required - set(optional)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)} in {where}; allowed: {sorted(required | set(optional))}")
    missing = required - set(d)
    if missing:
        raise ConfigError(f"{path}: missing key(s) {sorted(missing)} in {where}")


def _str(path: Path, where: str, v) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(f"{path}: {where} must be a non-empty string, got {v!r}")
    return v


def _quantities(path: Path, where: str, d, spec: dict) -> dict[str, Quantity]:
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: {where} must be a mapping, got {type(d).__name__}")
    _keys(path, where, d, set(spec))
    out = {}
    for k, (desc, lo, hi) in spec.items():
        q = d[k]
        name = f"{where}.{k}"
        if not isinstance(q, dict):
            raise ConfigError(f"{path}: {name} ({desc}) must be {{value, kind, source}}, got {q!r}")
        _keys(path, name, q, {"value", "kind", "source"})
        v = q["value"]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{path}: {name}.value must be a number, got {v!r}")
        if not (lo <= v <= hi) or (lo == 0.0 and v <= 0 and k not in ("per_op_us", "invoke_ms")):
            raise ConfigError(f"{path}: {name}.value {v} is out of range for {desc} ({lo}..{hi})")
        if q["kind"] not in KINDS:
            raise ConfigError(f"{path}: {name}.kind is {q['kind']!r}; one of {list(KINDS)}")
        out[k] = Quantity(float(v), q["kind"], _str(path, f"{name}.source", q["source"]))
    return out


def load_accelerator(name: str, root: Path = PROFILE_DIR) -> Accelerator:
    path = root / "accelerators" / f"{name}.yaml"
    if not path.exists():
        have = sorted(p.stem for p in (root / "accelerators").glob("*.yaml"))
        raise ConfigError(f"unknown accelerator {name!r} (no {path}); available: {have}")
    d = _load_yaml(path)
    _keys(path, "the accelerator", d, {"name", "title"} | set(ACCEL_FIELDS))
    if d["name"] != name:
        raise ConfigError(f"{path}: name {d['name']!r} differs from the file name {name!r}")
    fields = _quantities(path, "accelerator", {k: d[k] for k in ACCEL_FIELDS}, ACCEL_FIELDS)
    if fields["usable_cache_bytes"].value > fields["cache_bytes"].value:
        raise ConfigError(f"{path}: usable_cache_bytes exceeds cache_bytes")
    return Accelerator(name, _str(path, "title", d["title"]), fields)


def load_profile(name_or_path: str | Path, root: Path = PROFILE_DIR) -> Profile:
    """A profile by name (``hw/profiles/<name>.yaml``) or path."""
    p = Path(name_or_path)
    path = p if p.suffix in (".yaml", ".yml") else root / f"{name_or_path}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown timing profile {str(name_or_path)!r} (no {path}); available: {profile_names(root)}")
    d = _load_yaml(path)
    _keys(path, "the profile", d, {"name", "title", "stands_for", "host"}, {"link", "accelerator"})
    if ("link" in d) != ("accelerator" in d):
        raise ConfigError(f"{path}: a profile has both link and accelerator (a board with an accelerator) or neither "
                          "(CPU only)")
    host = _quantities(path, "host", d["host"], HOST_FIELDS)
    link = link_name = acc = None
    if "link" in d:
        ld = d["link"]
        if not isinstance(ld, dict):
            raise ConfigError(f"{path}: link must be a mapping with name and {sorted(LINK_FIELDS)}")
        _keys(path, "link", ld, {"name"} | set(LINK_FIELDS))
        link_name = _str(path, "link.name", ld["name"])
        link = _quantities(path, "link", {k: ld[k] for k in LINK_FIELDS}, LINK_FIELDS)
        if link["ceiling_mb_s"].value > link["signalling_mbit_s"].value / 8 * (1 + 1e-9):
            sig = link["signalling_mbit_s"].value
            raise ConfigError(f"{path}: link.ceiling_mb_s {link['ceiling_mb_s'].value} exceeds the signalling rate "
                              f"({sig} Mbit/s = {sig / 8:g} MB/s)")
        if link["bandwidth_mb_s"].value > link["ceiling_mb_s"].value * (1 + 1e-9):
            raise ConfigError(f"{path}: link.bandwidth_mb_s {link['bandwidth_mb_s'].value} exceeds what the link can "
                              f"carry (ceiling_mb_s {link['ceiling_mb_s'].value})")
        acc = load_accelerator(_str(path, "accelerator", d["accelerator"]), root)
    return Profile(_str(path, "name", d["name"]), _str(path, "title", d["title"]),
                   _str(path, "stands_for", d["stands_for"]), host, link, link_name, acc, path)


def profile_names(root: Path = PROFILE_DIR) -> list[str]:
    return sorted(p.stem for p in root.glob("*.yaml"))


def all_profiles(root: Path = PROFILE_DIR) -> list[Profile]:
    return [load_profile(n, root) for n in profile_names(root)]
