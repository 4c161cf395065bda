"""An option is named in its giver's terms: the same bad value is ``tp=3`` to a Python caller, ``--tp 3`` to the
shell and ``tp = 3`` in a sweep spec; and so are the refusals raised deeper, while a model is built, sharded or
quantized, or an output file is checked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import castcore
from castcore.cli.main import main
from castcore.options.option import terms

DATA = Path(__file__).parents[1] / "data"
LLAMA = str(DATA / "tiny-llama.json")  # 4 attention heads, 2 key/value heads
H100 = str(DATA / "h100-sxm.toml")
ISOLATED = ["--no-packs", "--device-file", H100]


def _refused(capsys, argv: list[str]) -> str:
    """Run the command line expecting a refusal: exit 2, no traceback, the error its last line of stderr (after
    what it was doing: "castcore: building ..."); the error line."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("castcore: error: ") and "Traceback" not in "\n".join(err), err
    assert sum(line.startswith("castcore: error: ") for line in err) == 1, err
    return err[-1]


# --- one bad value, three callers ----------------------------------------------------------------------------


@pytest.mark.parametrize("model, heads", [("llama-3-8b", 32), (LLAMA, 4)])
def test_python_names_the_keyword(model, heads):
    with pytest.raises(
        castcore.ModelError,
        match=r"^tp=3: .*num_attention_heads = "
        + str(heads)
        + r" does not divide by 3; .*\(use a tp that divides "
        + str(heads)
        + r"\)$",
    ):
        castcore.build_workload(model, tp=3)


def test_the_default_model_from_the_shell_names_the_flag(capsys):
    line = _refused(capsys, ["estimate", "--tp", "3", *ISOLATED])
    assert line.startswith("castcore: error: --tp 3: ")
    assert "num_attention_heads = 32 does not divide by 3" in line and line.endswith(
        "(use a --tp that divides 32)"
    )
    assert "tp=3" not in line


def test_the_shell_names_the_flag(capsys):
    line = _refused(capsys, ["estimate", "--model", LLAMA, "--tp", "3", *ISOLATED])
    assert line.startswith("castcore: error: --tp 3: ")
    assert "num_attention_heads = 4 does not divide by 3" in line and line.endswith(
        "(use a --tp that divides 4)"
    )


def test_a_sweep_spec_names_the_key(capsys, tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'command = "estimate"\nno_packs = true\ndevice_file = ["{H100}"]\nmodel = "{LLAMA}"\ntp = 3\n'
    )
    out = tmp_path / "rows.csv"
    line = _refused(capsys, ["sweep", str(spec), "--out", str(out)])
    assert "tp = 3: " in line and "num_attention_heads = 4 does not divide by 3" in line
    assert line.endswith("(use a tp that divides 4)")
    assert "--tp" not in line and "tp=3" not in line
    assert not out.exists()


# --- refusals raised deeper ----------------------------------------------------------------------------------

WEIGHTS = "16-bit weights in another dtype than the model's are not a quantization"


def test_a_weight_only_quantization_refusal_in_python_terms(session):
    # a 16-bit dtype that is not the model's
    workload = castcore.build_workload(LLAMA, seq=16, weights="fp16")
    said = f"weights='fp16' with dtype='bf16': {WEIGHTS}; use dtype='fp16', or weights=fp8, int8 or int4"
    with pytest.raises(castcore.ModelError, match=f"^{re.escape(said)}$"):
        session.estimate(workload)


def test_a_weight_only_quantization_refusal_in_cli_terms(capsys):
    line = _refused(capsys, ["estimate", "--model", LLAMA, "--seq", "16", "--weights", "fp16", *ISOLATED])
    assert line == (
        f"castcore: error: --weights fp16 with --dtype bf16: {WEIGHTS}; use --dtype fp16, or --weights "
        "fp8, int8 or int4"
    )


@pytest.fixture
def three_kv_heads(tmp_path) -> Path:
    """tiny-llama with 6 query heads and 3 key/value heads: tp=2 passes the config check (6 heads split), and the
    key/value heads are refused while the model is sharded."""
    path = tmp_path / "three-kv-heads.json"
    path.write_text(
        json.dumps(
            {
                **json.loads(Path(LLAMA).read_text()),
                "num_attention_heads": 6,
                "num_key_value_heads": 3,
                "hidden_size": 96,
            }
        )
    )
    return path


def test_a_tensor_parallel_split_refused_while_sharding_in_python_terms(session, three_kv_heads):
    workload = castcore.build_workload(str(three_kv_heads), seq=16, tp=2)
    with pytest.raises(
        castcore.ModelError,
        match=r"^tp=2: num_key_value_heads = 3 does not divide by 2; tensor "
        r"parallelism .* \(choose a tp that divides it, or a multiple of it\)$",
    ):
        session.estimate(workload)


def test_a_tensor_parallel_split_refused_while_sharding_in_cli_terms(capsys, three_kv_heads):
    line = _refused(
        capsys, ["estimate", "--model", str(three_kv_heads), "--seq", "16", "--tp", "2", *ISOLATED]
    )
    assert line.startswith("castcore: error: --tp 2: num_key_value_heads = 3 does not divide by 2; tensor ")
    assert line.endswith("(choose a --tp that divides it, or a multiple of it)")


def test_an_output_file_is_named_in_each_terms(tmp_path):
    from castcore.report.output_files import OutputError, check_output
    from castcore.sweeps.row_files import check_out

    bad = tmp_path / "rows.xlsx"
    said = {
        "python": f"out={str(bad)!r}: name a .parquet",
        "cli": f"--out {bad}: name a .parquet",
        "spec": f"out = {json.dumps(str(bad))}: name a .parquet",
    }
    for kind, start in said.items():
        with terms(kind), pytest.raises(OutputError, match=f"^{re.escape(start)}"):
            check_out(bad)
    folder = tmp_path / "trace.json"
    folder.mkdir()
    with pytest.raises(OutputError, match=f"^{re.escape(f'trace={str(folder)!r} is a directory')}"):
        check_output(folder, "trace")
    with terms("cli"), pytest.raises(OutputError, match=f"^{re.escape(f'--trace {folder} is a directory')}"):
        check_output(folder, "trace")


def test_a_mistyped_value_of_a_fixed_set_names_the_nearest():
    """Checked by castcore itself (Python, sweep specs), as argparse's choices are on the command line."""
    with pytest.raises(
        castcore.ModelError,
        match=r"kv_reads='grup': is not supported \(did you mean 'group'\?\); "
        r"use one of group, head",
    ):
        castcore.build_workload("llama-3-8b", kv_reads="grup")
    with pytest.raises(
        castcore.ModelError,
        match=r"unknown model 'qwen3' \(did you mean 'qwen3-8b' or 'qwen3-32b' or "
        r"'qwen3-30b-a3b'\?\)",
    ):
        castcore.build_workload("qwen3")
    with pytest.raises(castcore.ModelError, match=r"no option 'bach' \(did you mean 'batch'\?\)"):
        castcore.build_workload("llama-3-8b", bach=2)
