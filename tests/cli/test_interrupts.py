"""Ctrl-C and kill -9 at random moments: a sweep of 1,000 points resumes to the rows an uninterrupted run gives
(none lost, none twice), and a serve of a quantized model and a plan run again after kills give what they give
unkilled (the capture cache holds only whole entries). Bounded: a handful of interruptions, each within seconds."""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

DATA = Path(__file__).parents[1] / "data"
LLAMA, H100 = str(DATA / "tiny-llama.json"), str(DATA / "h100-sxm.toml")


def _spec(folder: Path) -> Path:
    """1,000 estimate points: 10 batches x 2 weight dtypes x 50 efficiency variants of the H100 profile (which
    share their captures, so the points run in seconds)."""
    text, files = Path(H100).read_text(), []
    for i in range(50):
        variant = folder / f"h100-v{i}.toml"
        variant.write_text(
            text.replace('name = "h100-sxm"', f'name = "h100-v{i}"').replace(
                "compute_efficiency = 0.78", f"compute_efficiency = {0.5 + i / 200:.3f}"
            )
        )
        files.append(str(variant))
    spec = {
        "command": "estimate",
        "model": LLAMA,
        "seq": 16,
        "batch": list(range(1, 11)),
        "weights": ["bf16", "int8"],
        "device": [f"h100-v{i}" for i in range(50)],
        "no_packs": True,
        "device_file": files,
    }
    path = folder / "spec.toml"
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in spec.items()))  # JSON values are TOML here
    return path


def _castcore(*argv: str, cache: Path) -> subprocess.Popen:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CASTCORE_")},
        "XDG_CACHE_HOME": str(cache),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "castcore", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as handle:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(handle)]


def test_a_sweep_killed_and_interrupted_at_random_resumes_to_the_same_rows(tmp_path):
    spec = _spec(tmp_path)
    whole = tmp_path / "whole.csv"
    done = _castcore(
        "sweep", str(spec), "--out", str(whole), "--workers", "2", "--yes", cache=tmp_path / "c1"
    )
    assert done.wait(timeout=300) == 0, done.stderr.read()
    chaos, rng = tmp_path / "chaos.csv", random.Random(2026)
    signals = [signal.SIGINT, signal.SIGKILL, signal.SIGINT, signal.SIGKILL]
    for number, sent in enumerate(signals):
        run = _castcore(
            "sweep",
            str(spec),
            "--out",
            str(chaos),
            "--workers",
            "2",
            "--yes",
            *(["--resume"] if number else []),
            cache=tmp_path / "c2",
        )
        time.sleep(rng.uniform(2.0, 6.0))
        run.send_signal(sent)
        code = run.wait(timeout=60)
        err = run.stderr.read()
        assert "Traceback" not in err, err
        if code == 0:  # it finished first
            break
        assert code == (130 if sent == signal.SIGINT else -signal.SIGKILL), (code, err)
        if sent == signal.SIGINT:
            assert err.strip().splitlines()[-1] == "castcore: interrupted"
    last = _castcore(
        "sweep", str(spec), "--out", str(chaos), "--workers", "2", "--yes", "--resume", cache=tmp_path / "c2"
    )
    assert last.wait(timeout=300) == 0, last.stderr.read()
    assert len(_rows(whole)) == 1000 and _rows(chaos) == _rows(whole)
    assert not list(tmp_path.glob(".chaos.csv.*"))  # no journal, lock or temporary left


@pytest.mark.parametrize(
    "argv",
    [
        (
            "serve",
            "--model",
            LLAMA,
            "--input",
            "32",
            "--output",
            "8",
            "--batch",
            "2",
            "--weights",
            "int8",
            "--kv-cache",
            "fp8",
            "--no-packs",
            "--device-file",
            H100,
            "--json",
        ),
        (
            "plan",
            "--model",
            LLAMA,
            "--input",
            "32",
            "--output",
            "8",
            "--tp",
            "1",
            "2",
            "--no-packs",
            "--device-file",
            H100,
            "--workers",
            "2",
            "--json",
        ),
    ],
    ids=["serve", "plan"],
)
def test_a_command_killed_midway_then_run_again_gives_what_an_unkilled_one_gives(tmp_path, argv):
    clean = _castcore(*argv, cache=tmp_path / "clean")
    out, err = clean.communicate(timeout=300)
    assert clean.returncode == 0, err
    rng = random.Random(7)
    for sent in (signal.SIGKILL, signal.SIGINT, signal.SIGKILL):
        run = _castcore(*argv, cache=tmp_path / "killed")
        time.sleep(rng.uniform(1.0, 4.0))
        run.send_signal(sent)
        code = run.wait(timeout=60)
        err = run.stderr.read()
        assert "Traceback" not in err, err
        assert code in (0, 130 if sent == signal.SIGINT else -signal.SIGKILL), (code, err)
    again = _castcore(*argv, cache=tmp_path / "killed")
    out_again, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert json.loads(out_again) == json.loads(out)
    assert not list((tmp_path / "killed").rglob("*.partial"))


def test_ctrl_c_while_a_worker_starts_waits_until_its_set_up_is_written():
    """A Ctrl-C that lands while a worker process is being started is taken once the start is done, so the
    worker never reads half its set-up (it died printing a traceback when that happened), even when another thread
    of the process is the one the signal reaches."""
    from castcore.sweeps.local import _interrupts_held

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, whatever ran before
    other = threading.Thread(target=time.sleep, args=(1.0,), daemon=True)
    other.start()
    reached_the_end = False
    try:
        with pytest.raises(KeyboardInterrupt):
            with _interrupts_held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                reached_the_end = True
        assert reached_the_end
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        if hasattr(signal, "pthread_sigmask"):
            assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_inside_an_eval_of_a_string_still_exits_130_under_python_m(tmp_path):
    """A Ctrl-C that escapes an eval() of a string (torch parses operator schemas with them) and that castcore then
    handles ends ``python -m castcore`` with 130, not by SIGINT: CPython 3.11 remembered it and killed the process
    with the signal at its exit, which a caller reads as a crash."""
    (tmp_path / "interrupted_in_eval.py").write_text(
        "import os\n"
        "import castcore.cli.main as cli\n"
        "def main(argv=None):\n"
        "    try:\n"
        "        eval('os.kill(os.getpid(), 2) or sum(range(10 ** 7))')\n"
        "    except KeyboardInterrupt:\n"
        "        return 130\n"
        "cli.main = main\n"
        "cli.console()\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "interrupted_in_eval"], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 130, run.stderr
