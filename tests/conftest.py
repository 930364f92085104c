import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(min(2, torch.get_num_threads()))

MDLM_FAMILIES = ("llada", "dream", "llada_moe")
BDLM_FAMILIES = ("sdar", "sdar_moe", "llada2")
ALL_FAMILIES = MDLM_FAMILIES + BDLM_FAMILIES


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def compiled_models(monkeypatch):
    """Models passed to ``dare.models.compile.compile_blocks`` during the test, which compiles them for real but
    with the ``eager`` backend (graph capture without code generation: fast on a CPU)."""
    import dare.models.compile as compile_module

    models, real = [], compile_module.compile_blocks

    def capture_only(model, **kwargs):
        models.append(real(model, **{**kwargs, "backend": "eager"}))
        return model

    monkeypatch.setattr(compile_module, "compile_blocks", capture_only)
    return models


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """A tiny checkpoint directory per family (written once per session)."""
    import dare  # noqa: F401
    from dare.models.tiny import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny")
    return {f: write_tiny_checkpoint(f, root / f, seed=1) for f in ALL_FAMILIES}
