"""Which model families castcore runs, and how: every capability tried on a tiny config of each family (real
transformers classes, built on meta tensors, the H100 test profile, no packs), written as docs/support.md.

    python -m tests.support_matrix > docs/support.md

tests/test_support_matrix.py runs the same and fails when what runs (each cell's yes or no, and what stays eager)
differs from docs/support.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import castcore
from castcore.hf.versions import TESTED

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
FAMILIES = {  # model_type: its tiny config
    "llama": "tiny-llama.json",
    "mistral": "tiny-mistral.json",
    "qwen2": "tiny-qwen2.json",
    "qwen3": "tiny-qwen3.json",
    "mixtral": "tiny-mixtral.json",
    "qwen3_moe": "tiny-qwen3-moe.json",
    "deepseek_v3": "tiny-deepseek-v3.json",
    "deepseek_v32": "tiny-deepseek-v32.json",
    "glm4_moe": "tiny-glm4-moe.json",
    "gpt_oss": "tiny-gpt-oss.json",
    "llama4_text": "tiny-llama4.json",
    "gemma2": "tiny-gemma2.json",
    "gemma3_text": "tiny-gemma3.json",
    "falcon": "tiny-falcon.json",
    "gptj": "tiny-gptj.json",
    "qwen3_next": "tiny-qwen3-next.json",
    "kimi_linear": "tiny-kimi-linear.json",
    "nemotron_h": "tiny-nemotron-h.json",
}
DECODE = {"phase": "decode", "kv_len": 32}
COLUMNS = {  # the capability: (how it runs, its options)
    "prefill": ("estimate", {}),
    "decode": ("estimate", DECODE),
    "serve": ("serve", {"input_tokens": 16, "output_tokens": 4, "batch": 2}),
    "simulate": ("simulate", {"requests": 6, "input_lengths": "16", "output_lengths": 4}),
    "train": ("estimate", {"train": True}),
    "tp 2": ("estimate", {"tp": 2}),
    "sp": ("estimate", {"tp": 2, "sp": True}),
    "pp 2": ("estimate", {"pp": 2}),
    "ep 2": ("estimate", {"ep": 2}),
    "attention-dp 2": ("estimate", {"attention_dp": 2, "batch": 2}),
    "int8": ("estimate", {"weights": "int8"}),
    "int4": ("estimate", {"weights": "int4"}),
    "fp8 W8A8": ("estimate", {"weights": "fp8", "activations": "fp8"}),
    "fp8-block": ("estimate", {"weights": "fp8-block"}),
    "nvfp4 (B200)": ("estimate", {"weights": "nvfp4"}),
    "mxfp4": ("estimate", {"weights": "mxfp4"}),
    "fp8 KV cache": ("estimate", {**DECODE, "kv_cache": "fp8"}),
}


# NVFP4 needs an FP4 matrix rate, which H100s lack: that column runs on castpack-nvidia's B200 profile.
B200 = ROOT / "packs" / "castpack-nvidia" / "castpack_nvidia" / "profiles" / "b200.toml"
ON_B200 = {"nvfp4 (B200)"}


def _cell(
    session: castcore.Session, config: str, how: str, options: dict, device: str | None = None
) -> tuple[str, list[str]]:
    """``yes`` or ``no: why``, and the run's notes."""
    try:
        if how == "serve":
            notes = session.serve(config, **options).prefill.notes
        elif how == "simulate":
            notes = session.simulate(config, **options).notes
        else:
            notes = session.estimate(castcore.build_workload(config, seq=16, **options), device=device).notes
    except castcore.CastcoreError as exc:
        return "no: " + _short(str(exc)), []
    except Exception as exc:  # castcore failed where it should have said why: a defect, shown as one
        return f"DEFECT: {type(exc).__name__}: " + _short(str(exc).splitlines()[0] if str(exc) else ""), []
    return "yes", notes


def _short(text: str) -> str:
    """The reason, without the option and model it names first, on one table cell."""
    reason = re.sub(
        r"tiny-[\w.-]+\.json:? |(?<=transformers) \d+\.\d+\.\d+", "", text.replace(f"{DATA}/", "")
    )
    while re.match(r"^[\w.=' -]+: ", reason) and len(reason.split(": ", 1)[1]) > 20:
        reason = reason.split(": ", 1)[1]
    reason = reason.split("; ")[0].replace("|", "/")
    return reason if len(reason) <= 70 else reason[:67] + "..."


def _eager(notes: list[str]) -> str:
    eager = [n.split(": ", 1)[1] for n in notes if n.startswith("stayed eager")]
    return f"eager: {eager[0]}" if eager else "all"


def matrix() -> dict[str, dict[str, str]]:
    session = castcore.Session(load_packs=[], device_files=[DATA / "h100-sxm.toml", B200])
    table = {}
    for family, name in FAMILIES.items():
        cells = {
            column: _cell(
                session, str(DATA / name), how, options, "b200" if column in ON_B200 else "h100-sxm"
            )
            for column, (how, options) in COLUMNS.items()
        }
        table[family] = {
            "deployed kernels": _eager(cells["prefill"][1]),
            **{column: answer for column, (answer, _) in cells.items()},
        }
    return table


def presets() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name in castcore.workload.spec.preset_names():
        family = castcore.workload.spec.load_model_config(name)["model_type"]
        found.setdefault(family, []).append(name)
    return found


def markdown(table: dict[str, dict[str, str]]) -> str:
    shipped = presets()
    lines = [
        "# What runs",
        "",
        "Every capability tried on a tiny model of each family castcore recognises (transformers' own classes "
        "built from config on meta tensors, the H100 test profile (castpack-nvidia's B200 profile for NVFP4, "
        "which needs an FP4 matrix rate), no packs): `yes`, or `no: ` and the gist "
        "of castcore's one-line reason. *Deployed kernels* says which blocks keep their eager graph instead of "
        "the kernels a serving engine runs (`all`: none). With the newest transformers castcore is tested on "
        f"({'.'.join(TESTED['transformers'][1].split('.')[:2])}); made by `python -m tests.support_matrix > docs/support.md`; "
        "`tests/test_support_matrix.py` fails when what runs differs from this page. castpack-nvidia ships "
        "profiles only, and castpack-amd's estimators only price a mixture-of-experts block's parts as AITER's fused "
        "MoE runs them, so on NVIDIA and AMD devices every family runs as it does here (no column of their own).",
        "",
    ]
    for column in COLUMNS:
        how, options = COLUMNS[column]
        said = [
            f"`{how}`",
            *([json.dumps(options)] if options else []),
            *(["(16 tokens)"] if how == "estimate" else []),
        ]
        lines.append(f"- **{column}**: " + " ".join(said))
    columns = ["deployed kernels", *COLUMNS]
    lines += ["", "| family | presets | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for family, cells in table.items():
        lines.append(
            f"| {family} | {', '.join(shipped.get(family, [])) or '-'} | "
            + " | ".join(cells[c] for c in columns)
            + " |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(matrix()), end="")
