"""Spatial indexes of map craters: the cells of a latitude-band tessellation against brute force."""

import numpy as np
import pytest

from trn.errors import DataError
from trn.geometry import MOON_RADIUS_KM, latlon_to_xyz
from trn.nav.spatial import CellIndex, CraterIndex


def brute_within(lat, lon, rad, point, radius):
    d = latlon_to_xyz(lat, lon, rad).reshape(-1, 3) - point
    return np.flatnonzero(np.einsum("ij,ij->i", d, d) <= radius ** 2)


def sphere_map(n: int, seed: int, relief_km: float = 9.0):
    rng = np.random.default_rng(seed)
    lat = np.degrees(np.arcsin(rng.uniform(-1, 1, n))).astype(np.float32)
    lon = rng.uniform(0, 360, n).astype(np.float32)
    rad = (MOON_RADIUS_KM + rng.uniform(-relief_km, relief_km, n)).astype(np.float32)
    return lat, lon, rad


@pytest.mark.parametrize("cell_deg", [0.5, 2.0, 7.3])
def test_cells_return_exactly_the_craters_within_reach(cell_deg):
    """Seeded points from the surface to 3,000 km up, reaches from 0 to beyond the Moon: the
    craters within reach, as brute force over the same float32 metadata finds them."""
    lat, lon, rad = sphere_map(30_000, 1)
    cells = CellIndex(lat, lon, rad, cell_deg=cell_deg)
    rng = np.random.default_rng(2)
    found = 0
    for _ in range(300):
        up = rng.normal(size=3)
        up /= np.linalg.norm(up)
        point = up * (MOON_RADIUS_KM + 10 ** rng.uniform(-1, 3.5) - 9.0)
        reach = 10 ** rng.uniform(-0.5, 3.6)
        got = cells.within(point, reach)
        want = brute_within(lat, lon, rad, point, reach)
        np.testing.assert_array_equal(got, want)
        found += len(got)
    assert found > 10_000


def test_constructed_cases_at_the_seam_the_poles_and_the_cell_edges():
    # craters either side of 0 degrees east, at both poles, on band and cell edges, above and below
    # the mean radius; windows across the seam, around a pole and down to one crater
    lat = np.array([0.0, 0.0, 0.0, 89.99, 90.0, -90.0, -89.5, 0.5, 0.5, 45.0, 45.0, 10.0], np.float32)
    lon = np.array([359.9999, 0.0001, 180.0, 17.0, 0.0, 123.0, 300.0, 0.5, 1.0, 359.5, 0.25, 90.0], np.float32)
    rad = np.array([1737.4, 1737.4, 1737.4, 1737.4, 1740.0, 1730.0, 1737.4, 1737.4, 1737.4, 1747.0, 1727.0, 1737.4],
                   np.float32)
    cells = CellIndex(lat, lon, rad, cell_deg=0.5)
    at = cells.at
    assert cells.within(at([0])[0] * (1 + 50 / 1737.4), 52.0).tolist() == [0, 1]  # across the seam, 50 km up
    assert cells.within(at([0])[0], 0.0).tolist() == [0]  # the crater itself, reach 0
    assert cells.within(np.array([0.0, 0.0, 1837.4]), 110.0).tolist() == [3, 4]  # over the north pole
    assert cells.within(np.array([0.0, 0.0, -1800.0]), 100.0).tolist() == [5, 6]  # over the south pole
    assert cells.within(np.array([0.0, 0.0, 0.0]), 1747.0).tolist() == list(range(12))  # from the centre
    assert cells.within(np.array([0.0, 0.0, 0.0]), 1726.9).tolist() == []
    for point, reach in [(at([7])[0], 16.0), (at([9])[0], 30.0), (at([10])[0] * 1.05, 100.0)]:
        np.testing.assert_array_equal(cells.within(point, reach), brute_within(lat, lon, rad, point, reach))
    # the k-d tree over the same positions agrees
    tree = CraterIndex(at(np.arange(12)))
    for point, reach in [(at([0])[0] * 1.03, 60.0), (np.array([0.0, 0.0, 1837.4]), 110.0)]:
        np.testing.assert_array_equal(cells.within(point, reach), tree.within(point, reach))


def test_cells_cost_four_bytes_a_crater_and_hold_the_metadata_uncopied():
    lat, lon, rad = sphere_map(200_000, 3)
    cells = CellIndex(lat, lon, rad)
    assert cells.lat is lat and cells.lon is lon and cells.radius is rad
    assert cells.nbytes <= 4 * len(lat) + 4 * 2 * 170_000
    assert cells.order.dtype == np.int32 and sorted(cells.order.tolist()) == list(range(len(lat)))


def test_bad_metadata_is_refused_by_name():
    lat, lon, rad = sphere_map(10, 4)
    with pytest.raises(DataError, match="three arrays"):
        CellIndex(lat, lon[:5], rad)
    with pytest.raises(DataError, match="finite"):
        CellIndex(np.where(np.arange(10) == 3, np.nan, lat), lon, rad)
    with pytest.raises(DataError, match="90 degrees"):
        CellIndex(lat + 100.0, lon, rad)
    with pytest.raises(DataError, match="cell_deg"):
        CellIndex(lat, lon, rad, cell_deg=0.0)
    assert CellIndex(lat[:0], lon[:0], rad[:0]).within(np.array([0.0, 0.0, 1800.0]), 100.0).tolist() == []


def test_a_window_refuses_crater_ids_that_do_not_fit_its_positions():
    from trn.nav.scenario import SearchWindow

    lat, lon, rad = sphere_map(10, 5)
    cells = CellIndex(lat, lon, rad)
    with pytest.raises(DataError, match="9 map crater ids for 10 positions"):
        SearchWindow([], np.zeros((0, 10)), list(range(9)), cells, None, threshold=0.9)
    with pytest.raises(DataError, match="11 map crater ids for 10 positions"):
        SearchWindow([], np.zeros((0, 10)), list(range(11)), cells.at(np.arange(10)), None, threshold=0.9)
