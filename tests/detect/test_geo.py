"""Georeferenced images: GeoTIFFs written here with a known CRS (equirectangular and south polar
stereographic on the Moon's sphere) read back, their pixels turned into latitude and longitude and
back, checked against the projections' own formulas written out below; then `trn-detect run` on
such a GeoTIFF, its CSV and GeoJSON checked against the same formulas and its catalogue report.
The refusals: a corrupt raster, a raster without a CRS and no --gsd, a catalogue whose columns
are not found, and a GeoTIFF read without rasterio."""

import csv
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from trn.errors import DataError

rasterio = pytest.importorskip("rasterio")
from rasterio.transform import from_origin  # noqa: E402

from trn.cli.detect import main  # noqa: E402
from trn.detect.catalogue import read_catalogue  # noqa: E402
from trn.detect.raster import open_image  # noqa: E402

R_M = 1737400.0
PX_M = 100.0
SHAPE = (1000, 1000)


class Equirectangular:
    crs = f"+proj=eqc +lat_ts=0 +lat_0=0 +lon_0=0 +x_0=0 +y_0=0 +R={R_M:.0f} +units=m +no_defs"
    x0, y0 = R_M * math.radians(29.5), R_M * math.radians(20.5)      # the image's top-left corner

    def pixel(self, lat, lon):
        x, y = R_M * np.radians(lon), R_M * np.radians(lat)
        return (x - self.x0) / PX_M, (self.y0 - y) / PX_M

    def lonlat(self, col, row):
        x, y = self.x0 + np.asarray(col) * PX_M, self.y0 - np.asarray(row) * PX_M
        return np.mod(np.degrees(x / R_M), 360.0), np.degrees(y / R_M)


class SouthPolar:
    crs = f"+proj=stere +lat_0=-90 +lon_0=0 +k=1 +x_0=0 +y_0=0 +R={R_M:.0f} +units=m +no_defs"
    x0, y0 = -20000.0, 80000.0          # around (x, y) = (30, 30) km from the pole

    def pixel(self, lat, lon):
        rho = 2 * R_M * np.tan(np.pi / 4 + np.radians(lat) / 2)
        x, y = rho * np.sin(np.radians(lon)), rho * np.cos(np.radians(lon))
        return (x - self.x0) / PX_M, (self.y0 - y) / PX_M

    def lonlat(self, col, row):
        x, y = self.x0 + np.asarray(col) * PX_M, self.y0 - np.asarray(row) * PX_M
        rho = np.hypot(x, y)
        return np.mod(np.degrees(np.arctan2(x, y)), 360.0), np.degrees(2 * np.arctan(rho / (2 * R_M)) - np.pi / 2)


def ground_km(lat1, lon1, lat2, lon2):
    p1, p2, dl = np.radians(lat1), np.radians(lat2), np.radians(lon2 - lon1)
    c = np.sin(p1) * np.sin(p2) + np.cos(p1) * np.cos(p2) * np.cos(dl)
    return R_M / 1000 * np.arccos(np.clip(c, -1, 1))


def rim_box(proj, lat, lon, dia_km):
    """The pixel box of each crater's rim, a circle of radius D / 2 on the sphere, from 360 points
    (the spherical destination formula) through the projection's formulas above."""
    d = dia_km[:, None] / 2 / (R_M / 1000)
    brg = np.radians(np.arange(360.0))[None, :]
    p1, l1 = np.radians(lat)[:, None], np.radians(lon)[:, None]
    p2 = np.arcsin(np.sin(p1) * np.cos(d) + np.cos(p1) * np.sin(d) * np.cos(brg))
    l2 = l1 + np.arctan2(np.sin(brg) * np.sin(d) * np.cos(p1), np.cos(d) - np.sin(p1) * np.sin(p2))
    c, r = proj.pixel(np.degrees(p2), np.degrees(l2))
    return np.stack([c.min(1), c.max(1), r.min(1), r.max(1)], axis=1)


def truth_craters(proj):
    """(lat, lon, diameter km) of craters placed at known pixels of the 1000 x 1000 image."""
    cols = np.array([150.0, 420.0, 700.0, 820.0, 300.0, 600.0])
    rows = np.array([200.0, 650.0, 300.0, 800.0, 850.0, 520.0])
    lon, lat = proj.lonlat(cols, rows)
    return lat, lon, np.array([6.0, 9.0, 12.0, 7.0, 8.0, 10.0])


def write_geotiff(path, proj, image=None, crs=True):
    img = np.full(SHAPE, 128, np.uint8) if image is None else image
    px = getattr(proj, "px", PX_M)
    kw = {"crs": proj.crs, "transform": from_origin(proj.x0, proj.y0, px, px)} if crs else {}
    with rasterio.open(path, "w", driver="GTiff", height=SHAPE[0], width=SHAPE[1], count=1, dtype="uint8", **kw) as ds:
        ds.write(img, 1)
    return path


@pytest.mark.parametrize("proj", [Equirectangular(), SouthPolar()], ids=["equirectangular", "south-polar-stereographic"])
def test_pixels_to_latitude_longitude_and_back_within_a_pixel(tmp_path, proj):
    img = open_image(write_geotiff(tmp_path / "a.tif", proj))
    g = img.georef
    assert g is not None and g.radius_km == pytest.approx(1737.4)
    lon3, lat3 = proj.lonlat(np.array([500.0, 501.0, 500.0]), np.array([500.0, 500.0, 501.0]))
    steps = [ground_km(lat3[0], lon3[0], lat3[k], lon3[k]) for k in (1, 2)]
    assert g.gsd_km(SHAPE) == pytest.approx(math.sqrt(steps[0] * steps[1]), rel=1e-3)
    lat, lon, dia = truth_craters(proj)
    truth = rim_box(proj, lat, lon, dia)
    glat, glon, gdia = g.box_geometry(truth)
    assert (ground_km(lat, lon, glat, glon) < 0.1).all()          # within one pixel on the ground
    assert np.abs(gdia - dia).max() < 0.1
    assert np.abs(g.crater_boxes(lat, lon, dia) - truth).max() < 1.0
    img.close()


def bowl_image(cols, rows, diam_px):
    from tests.detect.test_tiles import bowls

    return bowls(SHAPE, list(zip(cols, rows)), list(np.asarray(diam_px) / 2))


@pytest.mark.parametrize("proj", [Equirectangular(), SouthPolar()], ids=["equirectangular", "south-polar-stereographic"])
def test_run_on_a_geotiff_writes_latitude_longitude_and_a_catalogue_report(tmp_path, capsys, proj):
    lat, lon, dia = truth_craters(proj)
    c, r = proj.pixel(lat, lon)
    tif = write_geotiff(tmp_path / "scene.tif", proj, bowl_image(c, r, dia / 0.1))
    cat = tmp_path / "robbins.csv"
    with open(cat, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["CRATER_ID", "LAT_CIRC_IMG", "LON_CIRC_IMG", "DIAM_CIRC_IMG"])
        # longitudes as a -360..0 catalogue would give them: every file written gives them in [0, 360)
        w.writerows([[f"T{i}", la, lo - 360.0, d] for i, (la, lo, d) in enumerate(zip(lat, lon, dia))])
        w.writerow(["far", 0.0, 200.0, 10.0])       # off the image
    out = tmp_path / "out"
    assert main(["run", "models/detector", str(tif), "--out", str(out), "--threshold", "0.1", "--catalogue", str(cat),
                 "--catalogue-columns", "lat=LAT_CIRC_IMG,lon=LON_CIRC_IMG,diameter_km=DIAM_CIRC_IMG,id=CRATER_ID"]) == 0
    text = capsys.readouterr().out
    assert "ground sampling from the raster's transform and CRS" in text and "6 catalogue craters on the image" in text
    rows = list(csv.DictReader(open(out / "detections.csv")))
    assert rows, "the detector found nothing on the drawn craters"
    for row in rows:
        tlon, tlat = proj.lonlat(float(row["x"]), float(row["y"]))
        assert ground_km(tlat, tlon, float(row["lat"]), float(row["lon"])) < 0.1
    gj = json.loads((out / "detections.geojson").read_text())
    assert len(gj["features"]) == len(rows) and gj["body_radius_km"] == pytest.approx(1737.4)
    f0 = gj["features"][0]["geometry"]["coordinates"]
    assert f0[1] == pytest.approx(float(rows[0]["lat"])) and -180 <= f0[0] <= 180
    rep = json.loads((out / "catalogue_report.json").read_text())[0]
    assert rep["craters_on_image"] == 6 and rep["matched"] + rep["missed"] == 6
    assert rep["matched"] == sum(1 for row in rows if row["catalogue_id"])
    # new: the detections written (at or above the threshold) that match no catalogue crater; the
    # run scored lower ones too (for the AP), which are neither (an audit found 24,091 new of 138)
    assert rep["new"] == len(rows) - rep["matched"] == sum(1 for row in rows if not row["catalogue_id"])
    assert rep["detections_at_threshold"] == len(rows)
    missed = list(csv.DictReader(open(out / "catalogue_missed.csv")))
    assert all(0 <= float(m["lon"]) < 360 for m in missed)  # one longitude convention in every file


def test_a_corrupt_raster_is_refused_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "broken.tif"
    bad.write_bytes(b"II*\x00" + bytes(range(256)) * 8)
    assert main(["run", "models/detector", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "replace it" in err


def test_a_raster_without_a_crs_needs_a_ground_sampling(tmp_path, capsys):
    tif = write_geotiff(tmp_path / "plain.tif", Equirectangular(), crs=False)
    assert main(["run", "models/detector", str(tif), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(tif) in err and "no map projection (CRS)" in err and "--gsd KM" in err
    assert main(["run", "models/detector", str(tif), "--out", str(tmp_path / "o"), "--gsd", "0.1"]) == 0
    assert "ground sampling from --gsd" in capsys.readouterr().out


def test_a_catalogue_without_the_named_columns_is_refused(tmp_path, capsys):
    cat = tmp_path / "cat.csv"
    cat.write_text("name,y,x,size\nA,1,2,3\n")
    with pytest.raises(DataError, match=r"has no lat column .*'name', 'y', 'x', 'size'.*--catalogue-columns"):
        read_catalogue(cat)
    tif = write_geotiff(tmp_path / "scene.tif", Equirectangular())
    assert main(["run", "models/detector", str(tif), "--out", str(tmp_path / "o"), "--catalogue", str(cat),
                 "--catalogue-columns", "lat=LAT,lon=x,diameter_km=size"]) == 2
    err = capsys.readouterr().err
    assert str(cat) in err and "no column 'LAT'" in err and "--catalogue-columns" in err
    cat.write_text("lat,lon,diameter_km\n1,2,3\nnorth,2,3\n")
    with pytest.raises(DataError, match=r"cat.csv:3: lat column 'lat' holds 'north'"):
        read_catalogue(cat)


def test_a_catalogue_that_is_a_fifo_a_directory_or_not_a_csv_is_named_as_such(tmp_path):
    """An audit's reproductions: a FIFO and a directory were reported as "does not exist", and a
    field over the csv module's 131,072 characters (a one-line GeoJSON) was a traceback."""
    import os

    with pytest.raises(DataError, match="catalogue does not exist"):
        read_catalogue(tmp_path / "nowhere.csv")
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(DataError, match="catalogue is a directory"):
        read_catalogue(tmp_path / "dir.csv")
    os.mkfifo(tmp_path / "pipe.csv")
    with pytest.raises(DataError, match="not a regular file"):  # refused without opening it (it would block)
        read_catalogue(tmp_path / "pipe.csv")
    big = tmp_path / "big.csv"
    big.write_text("lat,lon,diameter_km\n1,2," + "9" * 200_000 + "\n")
    with pytest.raises(DataError, match=r"big.csv:2: is not a crater CSV .*field larger than field limit"):
        read_catalogue(big)
    geo = tmp_path / "craters.geojson"
    geo.write_text('{"type": "FeatureCollection", "features": [' + ", ".join(
        ['{"type": "Feature", "geometry": {"type": "Point", "coordinates": [1.0, 2.0]}}'] * 3000) + "]}")
    with pytest.raises(DataError, match="is JSON \\(a GeoJSON\\?\\), not CSV"):
        read_catalogue(geo)
    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(f"c{i}" for i in range(5000)) + "\n" + ",".join("1" * 5000) + "\n")
    with pytest.raises(DataError, match=r"its columns are \['c0', .*'c11', '... 4988 more'\]") as e:
        read_catalogue(wide)
    assert len(str(e.value)) < 600  # the columns are listed, not the file


def test_a_png_claiming_65535_px_a_side_is_named_and_a_failed_run_leaves_no_empty_output(tmp_path, capsys):
    """An audit's reproductions: OpenCV's pixel limit was a cv2.error traceback, and the failed run
    left an empty --out with overlays/; --out on a file named an internal sub-path."""
    import struct
    import zlib

    def chunk(t: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    png = tmp_path / "huge.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 65535, 65535, 8, 0, 0, 0, 0))
                    + chunk(b"IDAT", zlib.compress(bytes(100))) + chunk(b"IEND", b""))
    assert main(["run", "models/detector", str(png), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "huge.png: image declares more pixels (65535 x 65535 px) than OpenCV decodes" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()
    (tmp_path / "f").write_text("x")
    assert main(["run", "models/detector", str(png), "--out", str(tmp_path / "f")]) == 2
    assert f"--out {tmp_path / 'f'} is a file" in capsys.readouterr().err


class FarOff(Equirectangular):
    """An audit's case: a geotransform whose origin lies far off the body (y 1e13 m): latitudes of
    millions of degrees, which were written to CSV and GeoJSON without a word."""
    y0 = 1e13


class Geographic(Equirectangular):
    crs = f"+proj=longlat +R={R_M:.0f} +no_defs"
    x0, y0 = 10.0, 600.0  # degrees: the top rows lie past the pole


class OffTheDisc(Equirectangular):
    """An orthographic view whose corner pixels lie off the Moon's disc."""
    crs = f"+proj=ortho +lat_0=0 +lon_0=0 +R={R_M:.0f} +units=m +no_defs"
    x0, y0 = R_M * 0.999, R_M * 0.2


class FarEast(Equirectangular):
    """An easting of 1e13 m: PROJ folds it back onto the body at a plausible longitude (142 E),
    which the round trip through the CRS catches."""
    x0 = 1e13


class GeographicFarEast(Equirectangular):
    """Longitudes of 3.3e10 degrees in a longitude-latitude raster."""
    crs = f"+proj=longlat +R={R_M:.0f} +no_defs"
    x0, y0, px = 3.3e10, 20.0, 0.001


class StereographicFarOff(SouthPolar):
    """A polar stereographic origin 1e13 m off: every pixel folds onto the opposite pole."""
    x0 = 1e13


OFF_THE_BODY = [FarOff(), Geographic(), OffTheDisc(), FarEast(), GeographicFarEast(), StereographicFarOff()]


@pytest.mark.parametrize("proj", OFF_THE_BODY, ids=["far-off", "past-the-pole", "off-the-disc", "far-east",
                                                    "longitudes-far-east", "stereographic-far-off"])
def test_a_geotransform_that_puts_pixels_off_the_body_is_an_error_naming_file_and_transform(tmp_path, proj, capsys):
    tif = write_geotiff(tmp_path / "bad.tif", proj)
    img = open_image(tif)
    try:
        with pytest.raises(DataError, match=r"bad.tif: .*(geotransform|outside where the CRS)") as e:
            img.georef.to_lonlat(np.array([0.0, SHAPE[1] - 1.0]), np.array([0.0, SHAPE[0] - 1.0]))
    finally:
        img.close()
    assert "Traceback" not in str(e.value)
    assert main(["run", "models/detector", str(tif), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "bad.tif" in err and "Traceback" not in err and not (tmp_path / "o" / "detections.csv").exists()


def test_a_float64_geotiff_of_values_near_1e308_finds_what_its_float32_version_finds(tmp_path, capsys):
    """Finite float64 pixels of +-1.5e308 (an audit's family of the +-1e38 float32 image) overflowed
    to inf when read as float32 and found no crater, with exit status 0."""
    proj = Equirectangular()
    lat, lon, dia = truth_craters(proj)
    c, r = proj.pixel(lat, lon)
    scene = bowl_image(c, r, dia / 0.1).astype(np.float64)
    centred = scene - scene.mean()
    runs = {}
    for name, image, dtype in (("f32", (centred / 100.0).astype(np.float32), "float32"),
                               ("f64", centred * (1.5e308 / np.abs(centred).max()), "float64")):
        tif = tmp_path / f"{name}.tif"
        with rasterio.open(tif, "w", driver="GTiff", height=SHAPE[0], width=SHAPE[1], count=1, dtype=dtype,
                           crs=proj.crs, transform=from_origin(proj.x0, proj.y0, PX_M, PX_M)) as ds:
            ds.write(image, 1)
        assert main(["run", "models/detector", str(tif), "--out", str(tmp_path / name), "--threshold", "0.1"]) == 0
        runs[name] = [tuple(row[k] for k in ("l", "r", "t", "b")) for row in
                      csv.DictReader(open(tmp_path / name / "detections.csv"))]
    capsys.readouterr()
    assert runs["f32"] and runs["f64"] == runs["f32"]


class TinyPixels(Equirectangular):
    """A transform of a micrometre a pixel: on the body, but no scale a detector runs at."""
    px = 1e-6


def test_a_raster_whose_transform_gives_no_usable_scale_names_the_file_and_the_transform(tmp_path, capsys):
    tif = write_geotiff(tmp_path / "tiny.tif", TinyPixels())
    assert main(["run", "models/detector", str(tif), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "tiny.tif" in err and "transform" in err and "is the geotransform right" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()
    assert main(["run", "models/detector", str(tif), "--out", str(tmp_path / "o"), "--gsd", "0.1"]) == 0


def test_an_image_name_with_a_line_break_is_refused_before_it_can_inject_an_annotation_line(tmp_path, capsys):
    import cv2

    from trn.data.datasets.luna1 import Box, FrameAnnotation, read_annotations, write_annotations

    img = np.full((64, 64), 100, np.uint8)
    bad = tmp_path / "a\n7.png 1,0,9,0,9.png"  # would write a second line, a frame 7 with a box
    cv2.imwrite(str(tmp_path / "plain.png"), img)
    (bad).write_bytes((tmp_path / "plain.png").read_bytes())
    assert main(["run", "models/detector", str(bad), "--out", str(tmp_path / "o"), "--gsd", "0.1"]) == 2
    assert "line break" in capsys.readouterr().err and not (tmp_path / "o").exists()
    with pytest.raises(DataError, match="rename the image"):
        write_annotations(tmp_path / "ann.txt", [FrameAnnotation(0, "x\ny.png", (Box(1, 0, 9, 0, 9),))])
    assert not (tmp_path / "ann.txt").exists()
    write_annotations(tmp_path / "ann.txt", [FrameAnnotation(0, "nav_images/0.png", (Box(1, 0, 9, 0, 9),))])
    assert len(read_annotations(tmp_path / "ann.txt")) == 1


def test_a_plain_equirectangular_png_with_its_bounds_gets_latitude_and_longitude(tmp_path, capsys):
    """A user with a plain equirectangular map and no CRS (as ../shared/data/moon/albedo): the
    bounds and the body's radius on the command line give it what a GeoTIFF carries."""
    import cv2

    proj = Equirectangular()
    lat, lon, dia = truth_craters(proj)
    c, r = proj.pixel(lat, lon)
    png = tmp_path / "map.png"
    cv2.imwrite(str(png), bowl_image(c, r, dia / 0.1))
    w, n = math.degrees(proj.x0 / R_M), math.degrees(proj.y0 / R_M)
    e, s = w + math.degrees(SHAPE[1] * PX_M / R_M), n - math.degrees(SHAPE[0] * PX_M / R_M)
    out = tmp_path / "out"
    bounds = f"{w!r},{e!r},{s!r},{n!r}"
    assert main(["run", "models/detector", str(png), "--out", str(out), "--threshold", "0.1",
                 "--equirectangular", bounds]) == 0
    assert "ground sampling from the raster's transform and CRS" in capsys.readouterr().out
    rows = list(csv.DictReader(open(out / "detections.csv")))
    assert rows
    for row in rows:
        tlon, tlat = proj.lonlat(float(row["x"]), float(row["y"]))
        assert ground_km(tlat, tlon, float(row["lat"]), float(row["lon"])) < 0.1
    tif = write_geotiff(tmp_path / "scene.tif", proj)  # a raster with its own CRS: the option is refused
    assert main(["run", "models/detector", str(tif), "--out", str(tmp_path / "o2"), "--equirectangular", bounds]) == 2
    assert "carries its own map projection" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "models/detector", str(png), "--out", str(tmp_path / "o3"), "--equirectangular", "10,5,0,1"])
    assert "W < E" in capsys.readouterr().err


def test_a_geotiff_without_rasterio_names_the_extra(tmp_path):
    tif = write_geotiff(tmp_path / "scene.tif", Equirectangular())
    code = ("import sys; sys.modules['rasterio'] = None; from trn.cli.detect import main; "
            f"sys.exit(main(['run', 'models/detector', {str(tif)!r}, '--out', {str(tmp_path / 'o')!r}]))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert res.returncode == 2
    assert f"{tif} is a GeoTIFF" in res.stderr and "pip install 'trn[geo]'" in res.stderr
