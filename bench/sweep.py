"""castcore sweep at scale: a 400-point design-space sweep, cold and warm capture cache, local and Ray.

The spec: 2 models (llama-3-8b, mistral-7b) x 4 devices (h100-sxm and a100-sxm-80gb from tests/data, the A100
given an InfiniBand level as the H100 has, and a copy of each at 70% compute efficiency, as a user tries
efficiency variants) x 5 batch sizes (1..16) x 2 prompt lengths (512, 2048) x 5 parallel configurations (--tp 1,
2, 4, 8, 16: 16 spans two nodes), castcore estimate prefill points, no packs. Each run is ``castcore sweep`` as a
user runs it (a fresh process, worker start-up included):

  local cold   --workers N, an empty cache folder: every capture is made (once per workload, 100 of them)
  local warm   the same again: every capture comes from the disk cache
  ray cold     --backend ray (a local Ray instance of N CPUs, started and stopped by the run), empty cache
  ray warm     the same again
  ray-cluster  --backend ray --ray-address of a Ray instance of N CPUs started beforehand (``ray start --head``),
               as a cluster is: cold, then warm

Figures: seconds, points/s, captures made / reused in the sweep / loaded from disk, and the capture-cache hit
ratio (reused + loaded over all captures a point asked for). Targets on the 2-core machine: cold under 2
minutes, warm under 20 seconds, Ray within 1.3x of local.

    python bench/sweep.py [--workers 2] [--no-ray] [--out bench/results/sweep.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import figures  # bench/figures.py: this script runs with bench/ on its path

ROOT = Path(__file__).parent.parent
DATA = ROOT / "tests" / "data"
INFINIBAND = """
[[interconnect]]
name = "infiniband"
devices = 1024
bandwidth = 2.5e10
latency_s = 5e-6
efficiency = 0.9
topology = "clos"
"""
INFINIBAND_SOURCE = (
    '\n"interconnect.infiniband" = "this benchmark\'s assumption: one HDR 200 Gb/s NIC per GPU, '
    'as on a DGX A100 SuperPOD"\n'
)
RAY_PORT = 6391
TARGETS = {"cold_s": 120.0, "warm_s": 20.0, "ray_over_local": 1.3}
SUMMARY = re.compile(
    r"(\d+) points run in ([\d.]+) s.*captures: (\d+) made, (\d+) reused in this sweep, (\d+) from "
    r"the cache .*; (\d+) rows with an error"
)


def write_spec(folder: Path) -> Path:
    files = [str(DATA / "h100-sxm.toml")]
    for source in ("h100-sxm", "a100-sxm-80gb"):
        text = (DATA / f"{source}.toml").read_text()
        if "infiniband" not in text:  # as on a DGX A100 SuperPOD: one 200 Gb/s HDR InfiniBand NIC per GPU
            text = text.replace("\n[sources]", INFINIBAND + "\n[sources]", 1).rstrip("\n") + INFINIBAND_SOURCE
            (folder / f"{source}.toml").write_text(text)
            files.append(str(folder / f"{source}.toml"))
        variant = re.sub(
            r"(?m)^compute_efficiency = [\d.]+",
            "compute_efficiency = 0.70",
            text.replace(f'name = "{source}"', f'name = "{source}-eff70"'),
        )
        (folder / f"{source}-eff70.toml").write_text(variant)
        files.append(str(folder / f"{source}-eff70.toml"))
    spec = {
        "command": "estimate",
        "model": ["llama-3-8b", "mistral-7b"],
        "device": ["h100-sxm", "h100-sxm-eff70", "a100-sxm-80gb", "a100-sxm-80gb-eff70"],
        "batch": [1, 2, 4, 8, 16],
        "seq": [512, 2048],
        "tp": [1, 2, 4, 8, 16],
        "device_file": files,
        "no_packs": True,
    }
    path = folder / "spec.toml"
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in spec.items()))  # JSON values are TOML here
    return path


def run(
    spec: Path,
    cache: Path,
    out: Path,
    workers: int,
    backend: str,
    address: str | None = None,
    env: dict[str, str] | None = None,
) -> dict:
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "castcore",
            "sweep",
            str(spec),
            "--out",
            str(out),
            "--workers",
            str(workers),
            "--backend",
            backend,
            *(["--ray-address", address] if address else []),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(cache), **(env or {})},
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"castcore sweep failed:\n{done.stderr}")
    found = SUMMARY.search(done.stderr)
    ran, _, made, reused, loaded, errors = (float(x) if "." in x else int(x) for x in found.groups())
    asked = made + reused + loaded
    return {
        "backend": backend,
        "seconds": round(seconds, 1),
        "points": ran,
        "points_per_s": round(ran / seconds, 2),
        "captures_made": made,
        "captures_reused": reused,
        "captures_loaded": loaded,
        "hit_ratio": round((reused + loaded) / asked, 3) if asked else 0.0,
        "errors": errors,
    }


def start_head(cpus: int, env: dict[str, str]) -> subprocess.Popen:
    """``ray start --head --block`` in the background, once its port answers."""
    head = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            "--block",
            "--port",
            str(RAY_PORT),
            "--num-cpus",
            str(cpus),
            "--include-dashboard",
            "false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    for _ in range(120):
        try:
            socket.create_connection(("127.0.0.1", RAY_PORT), timeout=1).close()
            time.sleep(2)  # the GCS answers before the raylet has joined
            return head
        except OSError:
            time.sleep(0.5)
    head.terminate()
    raise SystemExit("ray start --head did not come up")


def markdown(results: dict) -> str:
    def table(about: dict) -> str:
        lines = [
            f"# castcore sweep: {results['points']} points ({results['spec']})",
            "",
            f"{about['machine']}, {about['cpus']} CPUs, Python {about['python']}, {about['date']}; "
            f"{results['workers']} workers",
            "",
            "| run | seconds | points/s | captures made | reused in sweep | from disk | hit ratio | errors |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, r in results["runs"].items():
            lines.append(
                f"| {name} | {r['seconds']} | {r['points_per_s']} | {r['captures_made']} | "
                f"{r['captures_reused']} | {r['captures_loaded']} | {r['hit_ratio']:.0%} | {r['errors']} |"
            )
        same = "yes" if results["rows_identical_across_runs"] else "NO"
        lines += ["", f"Rows identical in every run but their `seconds`: {same}"]
        lines += ["", "| target | value | goal | met |", "| --- | ---: | ---: | --- |"]
        lines += [
            f"| {name} | {value} | {goal} | {'yes' if met else 'NO'} |"
            for name, (value, goal, met) in results["targets"].items()
        ]
        return "\n".join(lines) + "\n"

    return table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--no-ray", action="store_true", help="local runs only")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "sweep.json"))
    args = parser.parse_args()
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="castcore-bench-sweep-") as tmp:
        folder = Path(tmp)
        spec = write_spec(folder)
        for backend in ["local"] + ([] if args.no_ray else ["ray", "ray-cluster"]):
            cache = folder / f"cache-{backend}"
            address, env, head = None, {}, None
            # a Ray instance already running, as on a cluster: started outside the runs
            if backend == "ray-cluster":
                address = f"127.0.0.1:{RAY_PORT}"
                token = folder / "ray-token"  # Ray's token authentication, with a token of this run's own
                token.write_text(secrets.token_hex(32))
                env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
                head = start_head(args.workers, {**os.environ, "XDG_CACHE_HOME": str(cache), **env})
            try:
                for state in ("cold", "warm"):
                    name = f"{backend} {state}"
                    runs[name] = run(
                        spec,
                        cache,
                        folder / f"{backend}-{state}.jsonl",
                        args.workers,
                        "local" if backend == "local" else "ray",
                        address,
                        env,
                    )
                    print(f"{name}: {runs[name]}", flush=True)
            finally:
                if head is not None:  # ray start --block stops the instance's processes when it is stopped
                    head.terminate()
                    head.wait(timeout=60)
                    # ...but leaves its address behind, where a later ray.init() would try to join it
                    current = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
                    if current.exists() and current.read_text().strip().endswith(f":{RAY_PORT}"):
                        current.unlink()
        rows = {
            name: [
                json.loads(line)
                for line in (folder / f"{name.replace(' ', '-')}.jsonl").read_text().splitlines()
            ]
            for name in runs
        }
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in rows["local cold"]]
    identical = all(
        [{k: v for k, v in r.items() if k != "seconds"} for r in other] == strip for other in rows.values()
    )
    targets = {
        "cold_s": (runs["local cold"]["seconds"], TARGETS["cold_s"]),
        "warm_s": (runs["local warm"]["seconds"], TARGETS["warm_s"]),
    }
    if not args.no_ray:
        for backend in ("ray", "ray-cluster"):
            for state in ("cold", "warm"):
                ratio = round(runs[f"{backend} {state}"]["seconds"] / runs[f"local {state}"]["seconds"], 2)
                targets[f"{backend}_over_local_{state}"] = (ratio, TARGETS["ray_over_local"])
    results = {
        "spec": "2 models x 4 devices x 5 batches x 2 lengths x 5 tp",
        "points": len(strip),
        "workers": args.workers,
        "runs": runs,
        "rows_identical_across_runs": identical,
        "targets": {k: (v, goal, v <= goal) for k, (v, goal) in targets.items()},
    }
    figures.write(args.out, results, markdown(results))


if __name__ == "__main__":
    main()
