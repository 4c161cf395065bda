"""--trace and --plot: a file that cannot be written fails before the work, one line, exit 2; a write that fails
midway (a full disk) leaves no partial file and an existing one intact; nothing is printed as if it had worked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from castcore.cli.main import main


def estimate(tiny_llama, h100_file, *extra: str) -> list[str]:
    return [
        "estimate",
        "--model",
        str(tiny_llama),
        "--seq",
        "8",
        "--no-packs",
        "--device-file",
        str(h100_file),
        *extra,
    ]


@pytest.mark.parametrize("option", ["--trace", "--plot"])
def test_a_directory_is_refused_by_name(option, tmp_path, tiny_llama, h100_file, capsys):
    assert main(estimate(tiny_llama, h100_file, option, str(tmp_path))) == 2
    out, err = capsys.readouterr()
    assert (
        out == ""
        and err.strip() == f"castcore: error: {option} {tmp_path} is a directory; give a file name inside it"
    )
    assert list(tmp_path.iterdir()) == []  # no dir.png beside it, nothing inside


@pytest.mark.parametrize("option", ["--trace", "--plot"])
def test_a_missing_folder_is_refused_before_the_work(option, tmp_path, tiny_llama, h100_file, capsys):
    target = tmp_path / "no" / "such" / "out.png"
    assert main(estimate(tiny_llama, h100_file, option, str(target))) == 2
    out, err = capsys.readouterr()
    assert out == "" and "does not exist; create it first" in err and "capturing" not in err


def test_a_failed_write_leaves_the_old_file_and_prints_no_report(
    tmp_path, tiny_llama, h100_file, capsys, monkeypatch
):
    trace = tmp_path / "trace.json"
    trace.write_text("the old trace", encoding="utf-8")
    real = Path.write_text

    def disk_full(self, *args, **kwargs):
        if self.parent == tmp_path:
            real(self, "half a trace", encoding="utf-8")  # some bytes land before the disk fills
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", disk_full)
    assert main(estimate(tiny_llama, h100_file, "--json", "--trace", str(trace))) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().endswith(
        f"castcore: error: --trace {trace}: No space left on device; nothing was written"
    )
    assert trace.read_text(encoding="utf-8") == "the old trace"
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]


def test_trace_and_plot_are_written_and_the_report_printed(tmp_path, tiny_llama, h100_file, capsys):
    trace, plot = tmp_path / "t.json", tmp_path / "roofline.png"
    assert main(estimate(tiny_llama, h100_file, "--json", "--trace", str(trace), "--plot", str(plot))) == 0
    report = json.loads(capsys.readouterr().out)
    slices = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == report["totals"]["calls"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["roofline.png", "t.json"]


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    import castcore.cli.devices as devices

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(devices, "run", interrupted)
    from castcore.cli.main import build_parser

    args = build_parser().parse_args(["devices"])
    assert args.func is interrupted
    assert main(["devices"]) == 130
    assert capsys.readouterr().err == "castcore: interrupted\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_a_device_is_written_in_place_and_never_replaced(tmp_path, tiny_llama, h100_file, capsys):
    import stat

    assert main(estimate(tiny_llama, h100_file, "--json", "--trace", "/dev/full")) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().endswith("castcore: error: --trace /dev/full: No space left on device")
    assert "wrote" not in err
    assert stat.S_ISCHR(Path("/dev/full").stat().st_mode)  # still the device, not a file renamed over it
    assert main(estimate(tiny_llama, h100_file, "--trace", "/dev/null")) == 0
    assert stat.S_ISCHR(Path("/dev/null").stat().st_mode)
    assert not [p for p in Path("/dev").iterdir() if p.name.endswith((".partial", ".partial.json"))]


def test_writers_of_one_file_at_once_each_leave_it_whole(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from castcore.report.output_files import _umask, write_whole

    target = tmp_path / "rows.csv"
    texts = [f"{n}\n" * 20000 for n in range(8)]

    def write(text):
        write_whole(target, "out", lambda p: p.write_text(text))

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(write, texts))
    assert target.read_text() in texts
    assert [p.name for p in tmp_path.iterdir()] == ["rows.csv"]
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()  # a new file's usual mode, not mkstemp's 0600


def test_a_second_sweep_onto_the_same_output_is_refused(tmp_path):
    from castcore.report.output_files import OutputError
    from castcore.sweeps import row_files

    out = tmp_path / "rows.csv"
    with row_files.held(out):
        said = f"out={str(out)!r} is being written by another castcore sweep"
        with pytest.raises(OutputError, match=re.escape(said)):
            with row_files.held(out):
                pass
    with row_files.held(out):  # free again once the first is done
        pass
    assert list(tmp_path.iterdir()) == []
