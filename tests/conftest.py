from __future__ import annotations

from pathlib import Path

import pytest

import castcore

DATA = Path(__file__).parent / "data"

# The files whose tests build transformers models and run castcore's touches of transformers' internals:
# ``nox -s oldest`` runs these (``pytest -m models``) against the oldest transformers and torch pyproject admits.
MODEL_TESTS = {
    "test_bands",
    "test_capture_cache",
    "test_checkpoint",
    "test_cli",
    "test_cost_definition",
    "test_cost_energy",
    "test_engine_step",
    "test_fp4",
    "test_fusing",
    "test_gpt_oss",
    "test_hf",
    "test_html",
    "test_kv_capacity",
    "test_latent",
    "test_launch",
    "test_llama",
    "test_llama4",
    "test_lora",
    "test_memory",
    "test_model_configs",
    "test_models",
    "test_moe",
    "test_options",
    "test_outputs",
    "test_parallel",
    "test_parallel_deploy",
    "test_parallel_ep",
    "test_parallel_pp",
    "test_parallel_sp",
    "test_pipeline",
    "test_plan_devices",
    "test_plan_disaggregated",
    "test_point_to_point",
    "test_quantize",
    "test_report",
    "test_reuse",
    "test_routing",
    "test_serve",
    "test_simulate",
    "test_simulate_attention_dp",
    "test_simulate_disaggregated",
    "test_simulate_prefix_spec",
    "test_stock_models",
    "test_threads",
    "test_unreached",
    "test_whole_ops",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "models: builds transformers models (nox -s oldest runs these)")


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.stem in MODEL_TESTS:
            item.add_marker(pytest.mark.models)


@pytest.fixture(autouse=True, scope="session")
def private_cache(tmp_path_factory):
    """castcore's cache (which packs have which hooks) and config (the per-user custom_op directory) in
    folders of the test run's own, never the user's."""
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    mp.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
    yield
    mp.undo()


@pytest.fixture
def h100_file() -> Path:
    return DATA / "h100-sxm.toml"


@pytest.fixture
def tiny_llama() -> Path:
    return DATA / "tiny-llama.json"


@pytest.fixture
def session(h100_file, monkeypatch) -> castcore.Session:
    """A session with no packs and the H100 test profile, unaffected by the caller's environment."""
    for var in (
        "CASTCORE_CUSTOM_OP_PATH",
        "CASTCORE_LOAD_PACKS",
        "CASTCORE_DISABLE_PACKS",
        "CASTCORE_STRICT",
    ):
        monkeypatch.delenv(var, raising=False)
    return castcore.Session(load_packs=[], device_files=[h100_file])


@pytest.fixture
def simple_profile() -> castcore.DeviceProfile:
    """Round numbers so hand-computed times are easy to check."""
    return castcore.device_from_dict(
        {
            "name": "round-numbers",
            "vendor": "test",
            "mma_flops": {"bfloat16": 100e12, "float32": 25e12},
            "gp_flops": {"bfloat16": 10e12, "float32": 5e12},
            "memory_bytes": 64e9,
            "memory_bandwidth": 1e12,
            "compute_efficiency": 0.5,
            "memory_efficiency": 0.8,
            "mma_op_cost_s": 4e-6,
            "gp_op_cost_s": 2e-6,
            "sources": {
                "mma_flops": "test value",
                "gp_flops": "test value",
                "memory_bytes": "test value",
                "memory_bandwidth": "test value",
                "compute_efficiency": "test value",
                "memory_efficiency": "test value",
                "mma_op_cost_s": "test value",
                "gp_op_cost_s": "test value",
            },
        },
        origin="conftest",
    )
