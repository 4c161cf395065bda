"""castcore audit (static) beside the core: the pack wins the ops it claims on Ascend devices."""

from __future__ import annotations

import json
import subprocess
import sys

WON = ["aten::mm", "aten::bmm", "aten::addmm", "aten::add.Tensor", "aten::_softmax", "aten::_fused_rms_norm",
       "ascend::rms_norm", "ascend::add_rms_norm", "ascend::swiglu", "ascend::rotary_mul",
       "ascend::apply_rotary_pos_emb", "ascend::prompt_flash_attention", "ascend::incre_flash_attention",
       "ascend::grouped_matmul", "ascend::moe_gating_top_k_softmax"]


def audit(*extra):
    done = subprocess.run([sys.executable, "-m", "castcore", "audit", "--json", *extra],
                          capture_output=True, text=True, env={"CASTCORE_LOAD_PACKS": "ascend", "PATH": ""})
    assert done.returncode == 0, done.stderr
    return {row["op"]: row for row in json.loads(done.stdout)}


def test_the_pack_wins_its_ops_on_the_910b3_without_conflict():
    rows = audit("--device", "ascend-910b3")
    for op in WON:
        assert rows[op]["status"] == "ok", op
        assert rows[op]["winner"]["plugin"].startswith("castpack-ascend"), op
        assert rows[op]["winner"]["kind"] == "estimator", op
    assert rows["aten::mm"]["shadowed"][0]["plugin"] == "core"  # the core's formula is still there, behind
    assert not [op for op, row in rows.items() if row["status"] == "CONFLICT"]


def test_on_a_non_ascend_device_the_core_answers_aten_ops(tmp_path):
    from pathlib import Path
    h100 = Path(__file__).resolve().parents[3] / "tests" / "data" / "h100-sxm.toml"
    rows = audit("--device-file", str(h100), "--device", "h100-sxm")
    assert rows["aten::mm"]["winner"]["plugin"] == "core"
    assert rows["ascend::rms_norm"]["winner"]["kind"] == "properties"  # FLOPs and bytes still known


RFC_MM = '''
import torch
import castcore

@castcore.register_op_estimator(torch.ops.aten.mm.default)
def mm(invoke, device):
    return 0.5
'''


def test_the_rfc_users_mm_estimator_answers_on_the_default_device(tmp_path):
    """The pack prices aten::linear whole on its devices; a user's file claiming aten::mm is asked first, so the
    linear calls are captured op by op and the user's mm answers them."""
    (tmp_path / "mm.py").write_text(RFC_MM)
    done = subprocess.run([sys.executable, "-m", "castcore", "estimate", "--seq", "16", "--custom-op-dir",
                           str(tmp_path), "--no-cache", "--json"], capture_output=True, text=True,
                          env={"CASTCORE_LOAD_PACKS": "ascend", "PATH": "", "XDG_CACHE_HOME": str(tmp_path / "c")})
    assert done.returncode == 0, done.stderr
    ops = {row["op"]: row for row in json.loads(done.stdout)["ops"]}
    assert ops["aten::mm"]["source"] == f"file:{tmp_path / 'mm.py'} (estimator)"
    assert "aten::linear" not in ops


USER_SILU = '''
import torch
import castcore

@castcore.register_op_estimator(torch.ops.aten.silu.default)
def silu(invoke, device):
    return 1e-6
'''


def test_a_users_claim_the_packs_rewrite_leaves_unreached_is_one_warning(tmp_path):
    (tmp_path / "silu.py").write_text(USER_SILU)
    done = subprocess.run([sys.executable, "-m", "castcore", "estimate", "--seq", "16", "--custom-op-dir",
                           str(tmp_path), "--no-cache"], capture_output=True, text=True,
                          env={"CASTCORE_LOAD_PACKS": "ascend", "PATH": "", "XDG_CACHE_HOME": str(tmp_path / "c")})
    assert done.returncode == 0, done.stderr
    line = (f"castcore: warning: file:{tmp_path / 'silu.py'}: its estimator for aten::silu (silu) is not reached in "
            "this workload: the deployed kernels run ascend::swiglu instead (--eager prices the graph op by op)")
    assert done.stderr.splitlines().count(line) == 1
