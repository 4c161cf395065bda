"""Reading device profiles: a TOML file, a package's folder of them, or a dict, with every field checked and
every number given a source (the layout docs/devices.md documents)."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from castcore.devices.dtypes import is_dtype_name
from castcore.devices.memory_kernels import parse_memory_kernels
from castcore.devices.profile import (
    BAND_FAMILIES,
    ENGINE_ALLREDUCE,
    PROTOCOLS,
    LIBRARIES,
    TOPOLOGIES,
    DeviceError,
    DeviceProfile,
    Interconnect,
)
from castcore.tomlfiles import read_toml, tomllib

_NUMBERS = (
    "memory_bytes",
    "memory_bandwidth",
    "compute_efficiency",
    "memory_efficiency",
    "mma_op_cost_s",
    "gp_op_cost_s",
    "comm_op_cost_s",
    "attention_op_cost_s",
    "low_latency_a2a_cost_s",
    "attention_efficiency",
    "grouped_mm_efficiency",
    "memory_half_bytes",
    "mma_memory_efficiency",
    "mma_half_bytes",
    "mma_floor_s",
    "l2_bytes",
    "clock_hz",
    "memory_latency_s",
    "tdp_w",
    "idle_w",
)
_KNOWN = {f.name for f in fields(DeviceProfile)} - {"origin"}


def load_device_file(path: str | Path) -> DeviceProfile:
    """Read one TOML profile; raise DeviceError naming the file and the field at fault."""
    return device_from_dict(read_toml(path, DeviceError, "device file"), origin=str(path))


def package_profiles(package: str, folder: str = "profiles", label: str | None = None) -> list[DeviceProfile]:
    """Every ``*.toml`` in ``folder`` of an installed package, validated: what a pack's
    ``device_profiles`` hook usually returns. ``label`` names the origin in messages (default: the package)."""
    from importlib import resources

    return package_profiles_in(resources.files(package) / folder, label or package)


def package_profiles_in(directory: Any, label: str) -> list[DeviceProfile]:
    """Every ``*.toml`` in ``directory`` (a path or a package resource), validated, named ``label:folder/file``."""
    return [
        device_from_dict(
            tomllib.loads(f.read_text(encoding="utf-8")), origin=f"{label}:{directory.name}/{f.name}"
        )
        for f in sorted(directory.iterdir(), key=lambda f: f.name)
        if f.name.endswith(".toml")
    ]


def device_from_dict(data: dict[str, Any], origin: str = "<dict>") -> DeviceProfile:
    """Build and validate a profile from the TOML layout documented in docs/devices.md."""

    def fail(msg: str) -> DeviceError:
        return DeviceError(f"{origin}: {msg}")

    unknown = sorted(set(data) - _KNOWN)
    if unknown:
        raise fail(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN))}")
    for required in ("name", "vendor", "mma_flops", "gp_flops", "memory_bytes", "memory_bandwidth"):
        if required not in data:
            raise fail(f"missing required field '{required}'")
    for key in ("name", "vendor"):
        if not isinstance(data[key], str) or not data[key]:
            raise fail(f"'{key}' must be a non-empty string")

    numbers: dict[str, float] = {}
    for key in _NUMBERS:
        if key in data:
            numbers[key] = _number(data[key], key, fail, positive=key in ("memory_bytes", "memory_bandwidth"))
    for key in (
        "compute_efficiency",
        "memory_efficiency",
        "attention_efficiency",
        "grouped_mm_efficiency",
        "mma_memory_efficiency",
    ):
        if key in numbers and not 0 < numbers[key] <= 1:
            raise fail(f"'{key}' = {numbers[key]} must be in (0, 1]")
    _check_power(numbers, fail)
    rates = {}
    fractions = {key: _dtype_fractions(data, key, fail) for key in ("mma_efficiency", "mma_tile_efficiency")}
    for unit in ("mma_flops", "gp_flops"):
        table = data[unit]
        if not isinstance(table, dict):
            raise fail(f"'{unit}' must be a table of dtype = op/s")
        for dtype, value in table.items():
            if not is_dtype_name(dtype):
                raise fail(
                    f"'{unit}.{dtype}' is not a torch dtype name (e.g. bfloat16, float16, float32, int8, hf32)"
                )
            table[dtype] = _number(value, f"{unit}.{dtype}", fail, positive=True)
        rates[unit] = dict(table)

    links = tuple(_interconnect(i, raw, fail) for i, raw in enumerate(data.get("interconnect", [])))
    tiling = _tiling(data, fail)
    sources = data.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) and v for v in sources.values()):
        raise fail("'sources' must be a table of field = \"where the number came from\"")
    bands = data.get("error_bands", {})
    if not isinstance(bands, dict) or set(bands) - set(BAND_FAMILIES):
        raise fail(
            f"'error_bands' must be a table of family = held-out median |error|; families: "
            f"{', '.join(BAND_FAMILIES)}"
        )
    bands = {key: _number(value, f"error_bands.{key}", fail) for key, value in bands.items()}
    kernels = parse_memory_kernels(
        data.get("memory_kernels", {}), lambda value, key: _number(value, key, fail), fail
    )
    paths = [
        *_number_paths(numbers, rates, links, tiling),
        *(f"memory_kernels.{family}" for family in kernels),
        *(f"error_bands.{key}" for key in bands),
        *(f"{key}.{dtype}" for key, table in fractions.items() for dtype in table),
    ]
    missing = [p for p in paths if not _sourced(p, sources)]
    if missing:
        raise fail(
            f"no source for {', '.join(missing)}: add them under [sources] (datasheet and page, or measurement, and date)"
        )
    default = data.get("default", False)
    if not isinstance(default, bool):
        raise fail("'default' must be true or false")
    # Read-only tables: a plugin must not be able to change the device for every op after it.
    return DeviceProfile(
        name=data["name"],
        vendor=data["vendor"],
        interconnect=links,
        sources=MappingProxyType(dict(sources)),
        default=default,
        origin=origin,
        error_bands=MappingProxyType(bands),
        memory_kernels=kernels,
        mma_efficiency=MappingProxyType(fractions["mma_efficiency"]),
        mma_tile_efficiency=MappingProxyType(fractions["mma_tile_efficiency"]),
        mma_flops=MappingProxyType(rates["mma_flops"]),
        gp_flops=MappingProxyType(rates["gp_flops"]),
        **tiling,
        **numbers,
    )


def _dtype_fractions(data: dict[str, Any], key: str, fail) -> dict[str, float]:
    """A table of dtype = fraction of that dtype's matrix peak (mma_efficiency, mma_tile_efficiency), checked."""
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise fail(f"'{key}' must be a table of dtype = fraction of that dtype's matrix peak")
    found = {}
    for dtype, value in table.items():
        found[dtype] = _number(value, f"{key}.{dtype}", fail, positive=True)
        if not is_dtype_name(dtype) or found[dtype] > 1:
            raise fail(f"'{key}.{dtype}' must name a torch dtype and be in (0, 1]")
    return found


def _check_power(numbers: dict[str, float], fail) -> None:
    """tdp_w and idle_w go together: a board limit above zero and an idle draw below it."""
    given = [key for key in ("tdp_w", "idle_w") if key in numbers]
    if len(given) == 1:
        raise fail(
            f"'{given[0]}' needs {'idle_w' if given[0] == 'tdp_w' else 'tdp_w'} too: the power model "
            "(docs/devices.md) runs between the idle draw and the board limit"
        )
    if given and not 0 <= numbers["idle_w"] < numbers["tdp_w"]:
        raise fail(f"'idle_w' = {numbers['idle_w']:g} must be below 'tdp_w' = {numbers['tdp_w']:g} (watts)")


def _number(value: Any, key: str, fail, positive: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise fail(f"'{key}' = {value!r} must be a finite number >= 0")
    if positive and value == 0:
        raise fail(f"'{key}' must be greater than 0")
    return float(value)


def _interconnect(i: int, raw: Any, fail) -> Interconnect:
    where = f"interconnect[{i}]"
    if not isinstance(raw, dict):
        raise fail(f"'{where}' must be a table")
    for key in ("name", "devices", "latency_s"):
        if key not in raw:
            raise fail(f"'{where}' is missing '{key}'")
    unknown = sorted(set(raw) - {f.name for f in fields(Interconnect)})
    if unknown:
        raise fail(f"'{where}' has unknown field(s) {', '.join(unknown)}")
    if not isinstance(raw["devices"], int) or raw["devices"] < 1:
        raise fail(f"'{where}.devices' must be a whole number >= 1")
    topology = raw.get("topology", "switch")
    if topology not in TOPOLOGIES:
        raise fail(f"'{where}.topology' = {topology!r}; use one of {', '.join(TOPOLOGIES)}")
    efficiency = _number(raw.get("efficiency", 1.0), f"{where}.efficiency", fail, positive=True)
    if efficiency > 1:
        raise fail(f"'{where}.efficiency' = {efficiency} must be in (0, 1]")
    reduction = _number(raw.get("reduction_efficiency", 0.0), f"{where}.reduction_efficiency", fail)
    if reduction > 1:
        raise fail(f"'{where}.reduction_efficiency' = {reduction} must be in [0, 1]")
    if reduction and topology != "switch":
        raise fail(
            f"'{where}.reduction_efficiency' needs topology 'switch' (only a switch can reduce in the "
            f"network), not {topology!r}"
        )
    engine = {key: _number(raw.get(key, 0.0), f"{where}.{key}", fail) for key in ENGINE_ALLREDUCE}
    if any(engine.values()) and not all(engine.values()):
        raise fail(
            f"'{where}' gives part of the engine all-reduce; give all of {', '.join(ENGINE_ALLREDUCE)}, "
            "or none"
        )
    library = raw.get("library", "nccl")
    if library not in LIBRARIES:
        raise fail(f"'{where}.library' = {library!r}; use one of {', '.join(LIBRARIES)}")
    protocols = _step_latencies(raw, f"{where}.protocol_latency_s", fail)
    tree = _step_latencies(raw, f"{where}.tree_latency_s", fail)
    if tree and not protocols:
        raise fail(f"'{where}.tree_latency_s' needs 'protocol_latency_s', the ring's step latencies")
    max_ranks = raw.get("engine_allreduce_max_ranks", 0)
    if isinstance(max_ranks, bool) or not isinstance(max_ranks, int) or max_ranks < 0:
        raise fail(f"'{where}.engine_allreduce_max_ranks' must be a whole number >= 0 (0: no limit)")
    bandwidth, nic, nics = _fabric_bandwidth(raw, where, fail)
    return Interconnect(
        name=str(raw["name"]),
        devices=raw["devices"],
        topology=topology,
        efficiency=efficiency,
        bandwidth=bandwidth,
        nic_bandwidth=nic,
        nics_per_device=nics,
        latency_s=_number(raw["latency_s"], f"{where}.latency_s", fail),
        reduction_efficiency=reduction,
        reduction_latency_s=_number(
            raw.get("reduction_latency_s", 0.0), f"{where}.reduction_latency_s", fail
        ),
        protocol_latency_s=protocols,
        library=library,
        tree_latency_s=tree,
        engine_allreduce_max_ranks=max_ranks,
        **engine,
    )


def _step_latencies(raw: dict[str, Any], where: str, fail) -> tuple[float, ...]:
    """A level's seconds a step of each library protocol (``protocol_latency_s``, ``tree_latency_s``), or ()."""
    values = raw.get(where.rsplit(".", 1)[1], [])
    if not isinstance(values, list) or len(values) not in (0, len(PROTOCOLS)):
        raise fail(
            f"'{where}' must be [{', '.join(PROTOCOLS)}]: seconds a step of each protocol "
            "(0 where the library does not run it)"
        )
    steps = tuple(_number(v, f"{where}[{k}]", fail) for k, v in enumerate(values))
    if steps and not any(steps):
        raise fail(f"'{where}' offers no protocol; give at least one step latency above 0")
    return steps


def _fabric_bandwidth(raw: dict[str, Any], where: str, fail) -> tuple[float, float, float]:
    """(bandwidth, nic_bandwidth, nics_per_device): bandwidth as given, or a NIC's rate times the NICs a device
    has; both ways at once must agree, so a profile never holds two figures for one link."""
    if "nic_bandwidth" not in raw:
        if "nics_per_device" in raw:
            raise fail(f"'{where}.nics_per_device' needs 'nic_bandwidth', one NIC's line rate one way (B/s)")
        if "bandwidth" not in raw:
            raise fail(f"'{where}' is missing 'bandwidth' (or 'nic_bandwidth' with 'nics_per_device')")
        return _number(raw["bandwidth"], f"{where}.bandwidth", fail, positive=True), 0.0, 0.0
    nic = _number(raw["nic_bandwidth"], f"{where}.nic_bandwidth", fail, positive=True)
    nics = _number(raw.get("nics_per_device", 1.0), f"{where}.nics_per_device", fail, positive=True)
    derived = nic * nics
    if "bandwidth" in raw:
        given = _number(raw["bandwidth"], f"{where}.bandwidth", fail, positive=True)
        if not math.isclose(given, derived, rel_tol=1e-9):
            raise fail(
                f"'{where}.bandwidth' = {given:g} disagrees with nic_bandwidth x nics_per_device = {derived:g}; "
                "give one of them"
            )
    return derived, nic, nics


def _tiling(data: dict[str, Any], fail) -> dict[str, Any]:
    """compute_units, mma_unit and mma_tile, checked: every tile a whole number of its dtype's MMA units."""
    found: dict[str, Any] = {}
    units = data.get("compute_units")
    if units is not None:
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise fail(f"'compute_units' = {units!r} must be a whole number >= 1 (SMs, AI cores)")
        found["compute_units"] = units
    shapes: dict[str, dict[str, Any]] = {}
    for key in ("mma_unit", "mma_tile"):
        table = data.get(key, {})
        if not isinstance(table, dict):
            raise fail(f"'{key}' must be a table of dtype = [m, n, k]")
        shapes[key] = {}
        for dtype, value in table.items():
            if not is_dtype_name(dtype):
                raise fail(f"'{key}.{dtype}' is not a torch dtype name (e.g. bfloat16, float8_e4m3fn, int8)")
            tiles = value if key == "mma_tile" and value and isinstance(value[0], list) else [value]
            for tile in tiles:
                if (
                    not isinstance(tile, list)
                    or len(tile) != 3
                    or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in tile)
                ):
                    raise fail(
                        f"'{key}.{dtype}' = {value!r} must be [m, n, k] of whole numbers >= 1"
                        + (" (or a list of them)" if key == "mma_tile" else "")
                    )
            shapes[key][dtype] = tuple(tuple(t) for t in tiles) if key == "mma_tile" else tuple(tiles[0])
    for dtype, tiles in shapes["mma_tile"].items():
        unit = shapes["mma_unit"].get(dtype)
        if unit is None:
            raise fail(
                f"'mma_tile.{dtype}' needs 'mma_unit.{dtype}', the MMA instruction shape the tile is made of"
            )
        for tile in tiles:
            if any(t < u or t % u for t, u in zip(tile, unit)):
                raise fail(
                    f"'mma_tile.{dtype}' tile {list(tile)} is not a whole number of its MMA unit {list(unit)} "
                    "in every dimension (a tile smaller than, or not a multiple of, the unit it is made of)"
                )
    if shapes["mma_tile"] and "compute_units" not in found:
        raise fail("'mma_tile' needs 'compute_units', the units its tiles are spread over")
    found["mma_unit"] = MappingProxyType(shapes["mma_unit"])
    found["mma_tile"] = MappingProxyType(shapes["mma_tile"])
    return found


def _number_paths(numbers, rates, links, tiling) -> list[str]:
    paths = list(numbers) + (["compute_units"] if "compute_units" in tiling else [])
    paths += [f"{key}.{dtype}" for key in ("mma_unit", "mma_tile") for dtype in tiling[key]]
    paths += [f"{unit}.{dtype}" for unit, table in rates.items() for dtype in table]
    paths += [f"interconnect.{link.name}" for link in links]
    return paths


def _sourced(path: str, sources: dict[str, str]) -> bool:
    parts = path.split(".")
    return any(".".join(parts[:n]) in sources for n in range(1, len(parts) + 1))
