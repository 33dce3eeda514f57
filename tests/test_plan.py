"""The static memory plan reproduces QUANT.md §7's 27B budget on the RTX 3090 profile."""
import json

import pytest

from capture import main
from graphs.plan import load_profile, plan
from layers.config import ModelConfig, qwen38_27b


def test_27b_plan_matches_the_reference_budget():
    p = plan(qwen38_27b(), load_profile("rtx3090"))
    assert p.weight_bytes / 2**30 == pytest.approx(14.4, abs=0.1)              # QUANT.md §7: ≈ 14.4 GiB
    assert p.state_bytes_per_seq / 2**20 == pytest.approx(360 + 6.6, abs=1)    # 5 fp16 slots + widened conv
    assert p.kv_bytes_per_token == (16 + 1) * 2 * 4 * 256                      # fp8, target + MTP layer
    assert p.max_tokens(24 * 2**30, 64) < p.max_tokens(24 * 2**30, 1)


def test_context_is_capped_at_the_models_limit(capsys):
    """The demo model (max_position_embeddings 8192) was planned 30 million tokens of context at one sequence."""
    from engine.engine import DEMO_MODEL
    cfg = ModelConfig.from_dir(DEMO_MODEL)
    p = plan(cfg, load_profile("rtx3090"))
    assert p.max_tokens(24 * 2**30, 1) == cfg.max_position_embeddings == 8192
    assert plan(qwen38_27b(), load_profile("rtx3090")).max_tokens(24 * 2**30, 64) < 8192
    assert main([]) == 0
    assert "| 1 | 8,192 (max_position_embeddings) |" in capsys.readouterr().out


def test_capture_reports_errors(capsys):
    assert main(["--model", "/nonexistent"]) == 2
    assert "config.json: not found" in capsys.readouterr().err
    assert main(["--model", "/nonexistent", "--profile", "nope"]) == 2


@pytest.mark.parametrize("edit, field", [
    (lambda p: p.update(memory_gib="24"), "memory_gib"), (lambda p: p.update(memory_gib=-1), "memory_gib"),
    (lambda p: p.update(batch_buckets=[0]), "batch_buckets"),
    (lambda p: p.update(batch_buckets=[1.5]), "batch_buckets"),
    (lambda p: p.update(kv_dtype="int3"), "kv_dtype"), (lambda p: p.pop("spec_k"), "spec_k"),
    (lambda p: p.update(spec_k=-1), "spec_k"),
])
def test_profile_fields_are_checked_by_name(tmp_path, capsys, edit, field):
    """A bad profile field fails in one line naming it (they raised tracebacks, or printed a nonsense plan)."""
    profile = load_profile("rtx3090")
    edit(profile)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(profile))
    assert main(["--profile", str(path)]) == 2
    assert f"field '{field}'" in capsys.readouterr().err
    path.write_text("[1, 2]")
    assert main(["--profile", str(path)]) == 2 and "must be a JSON object" in capsys.readouterr().err
    assert main(["--profile", str(tmp_path) + "/x.json", "--model", str(path)]) == 2
