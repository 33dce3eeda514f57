"""The static memory plan reproduces QUANT.md §7's 27B budget on the RTX 3090 profile; its prediction of the
runner's buffers is what graphs/buffers.Buffers allocates; a configuration that does not fit says what would."""
import json

import pytest
import torch

from capture import main
from graphs.buffers import Buffers
from graphs.plan import Fit, load_profile, plan, runner_bytes
from kernels import device as gpu
from layers.config import QWEN38_27B, ModelConfig, qwen38_27b
from tests.fixtures import BASE, CONFIGS


def test_27b_plan_matches_the_reference_budget():
    p = plan(qwen38_27b(), load_profile("rtx3090"))
    assert p.weight_bytes / 2**30 == pytest.approx(14.4, abs=0.1)              # QUANT.md §7: ≈ 14.4 GiB
    assert p.state_bytes_per_seq / 2**20 == pytest.approx(360 + 6.6, abs=1)    # 5 fp16 slots + widened conv
    assert p.kv_bytes_per_token == (16 + 1) * 2 * 4 * 256                      # fp8, target + MTP layer
    fit = Fit(qwen38_27b(), load_profile("rtx3090"))
    assert fit.max_len(64) < fit.max_len(1)


def test_context_is_capped_at_the_models_limit(capsys):
    """The demo model (max_position_embeddings 8192) was planned 30 million tokens of context at one sequence."""
    from engine.engine import DEMO_MODEL
    cfg = ModelConfig.from_dir(DEMO_MODEL)
    assert Fit(cfg, load_profile("rtx3090")).max_len(1) == cfg.max_position_embeddings == 8192
    assert Fit(qwen38_27b(), load_profile("rtx3090")).max_len(64) < 8192
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
    (lambda p: p.update(spec_k=-1), "spec_k"), (lambda p: p.pop("prefill_chunk"), "prefill_chunk"),
    (lambda p: p.update(prefill_chunk=0), "prefill_chunk"), (lambda p: p.update(prefill_budget=2.5), "prefill_budget"),
    (lambda p: p.update(spec_k_by_bucket=[1]), "spec_k_by_bucket"),
    (lambda p: p.update(spec_k_by_bucket={"3": 1}), "spec_k_by_bucket"),
    (lambda p: p.update(spec_k_by_bucket={"64": 5}), "spec_k_by_bucket"),
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


def allocated(obj, seen) -> int:
    """Bytes of the distinct device storages reachable from obj (tensors, lists, tuples, dicts, attributes;
    host_out, the pinned host copies of a step's tokens, is not device memory)."""
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if isinstance(obj, (list, tuple, dict)):
        return sum(allocated(o, seen) for o in (obj.values() if isinstance(obj, dict) else obj))
    if not hasattr(obj, "__dict__"):
        return 0
    return sum(allocated(o, seen) for name, o in vars(obj).items() if name != "host_out")


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seqs, max_len, k, chunk, kv, draft_vocab, ks", [
    (4, 100, 0, 16, torch.uint8, None, ()), (3, 64, 2, 40, torch.bfloat16, None, ()),
    (8, 300, 4, 128, torch.uint8, 100, (0, 1, 3))])
def test_runner_bytes_predict_the_buffers(name, seqs, max_len, k, chunk, kv, draft_vocab, ks):
    cfg = ModelConfig.from_dict({**BASE, **CONFIGS[name], "model_type": "qwen3_5_text"})
    buffers = Buffers(cfg, seqs, max_len, k, chunk, kv, "cpu", draft_vocab=draft_vocab, ks=ks)
    predicted = runner_bytes(cfg, seqs, max_len, k, chunk, "fp8_e4m3" if kv == torch.uint8 else "bfloat16",
                             gpu.num_sms("cpu"), draft_vocab, ks)
    assert predicted == allocated(buffers, set())


def test_a_plan_that_does_not_fit_says_what_would():
    """The 27B at 64 sequences does not fit a 3090 at any context with MTP-4 (64 × 5 fp16 state slots alone are
    23 GiB); without drafting (one slot each) it does, and the error says so."""
    fit = Fit(qwen38_27b(), load_profile("rtx3090"))
    plain = Fit(qwen38_27b(), load_profile("rtx3090"), spec_k=0).max_len(64)   # one state slot a sequence
    assert 0 < plain < 32768
    with pytest.raises(ValueError, match=r"no max_len fits at max_seqs 64; at max_len 32768 at most max_seqs 5; "
                                         rf"without drafting \(spec_k 0\) max_len {plain} at max_seqs 64$"):
        fit.check(64, 32768)
    with pytest.raises(ValueError, match=r"without drafting \(spec_k 0\) max_seqs 64 x max_len 512 fits$"):
        fit.check(64, 512)
    assert fit.fits(5, 32768) and not fit.fits(6, 32768)
    n = fit.max_len(16)
    assert 0 < n < 32768 and fit.check(16, n) <= 24 * 2**30 and not fit.fits(16, n + 1)
    with pytest.raises(ValueError, match=f"at max_seqs 16 at most max_len {n} fits; at max_len 32768 at most"):
        fit.check(16, 32768)
    assert Fit(qwen38_27b(), load_profile("h200")).max_len(1) == 262144        # capped at max_position_embeddings


def test_the_default_bucket_leaves_each_sequence_the_context_asked():
    buckets = [64, 32, 16, 8, 4, 2, 1]
    assert Fit(qwen38_27b(), load_profile("h200")).bucket(buckets, 2048) == 64
    assert Fit(qwen38_27b(), load_profile("rtx3090")).bucket(buckets, 2048) == 16          # MTP-4: 5 state slots
    assert Fit(qwen38_27b(), load_profile("rtx3090"), spec_k=0).bucket(buckets, 2048) == 32
    assert Fit(qwen38_27b(), load_profile("rtx3090")).bucket(buckets, 10**6) == 1           # none fits: smallest


@pytest.fixture
def model_27b(tmp_path):
    """A directory holding only the 27B config: all the plan reads."""
    (tmp_path / "config.json").write_text(open(QWEN38_27B).read())
    return str(tmp_path)


def test_capture_fails_before_allocating_saying_what_fits(model_27b, capsys):
    assert main(["--model", model_27b, "--max-seqs", "64", "--max-len", "32768"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: max_seqs 64 x max_len 32768 (spec_k 4, prefill chunk 1024) needs ")
    assert "no max_len fits at max_seqs 64; at max_len 32768 at most max_seqs 5" in err
    assert main(["--model", model_27b, "--max-seqs", "0"]) == 2
    assert "--max-seqs must be >= 1, got 0" in capsys.readouterr().err
    assert main(["--model", model_27b, "--max-len", "40", "--max-seqs", "1"]) == 2
    assert "--max-len 40 is too short for the checks" in capsys.readouterr().err


def test_capture_plan_table(model_27b, tmp_path, capsys):
    """The default on a 3090: 16k context, the largest bucket that fits it (8), the runner's buffers itemised;
    without CUDA it stops after the plan (exit 0) and --json has it."""
    out = tmp_path / "plan.json"
    assert main(["--model", model_27b, "--profile", "rtx3090", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| runner buffers at 8 x 16384 | 7.5" in text and "GiB: kv 4.27 GiB, state 2.86 GiB" in text
    assert "| weights | 14.46 GiB |" in text
    assert "| 64 | 0 |" in text and "graph capture needs CUDA" in text
    report = json.loads(out.read_text())
    assert report["max_seqs"] == 8
    assert report["plan"]["context_by_bucket"]["1"] == Fit(qwen38_27b(), load_profile("rtx3090")).max_len(1)


class StubRunner:
    """The ModelRunner calls capture.replay_check makes; `drift` makes replayed steps differ from eager ones."""

    def __init__(self, drift=False):
        self.cfg, self.drift, self.calls = qwen38_27b(), drift, []

    def set_seed(self, seed):
        self.t = 0

    def set_sampling(self, slot, temperature, top_k, top_p):
        assert slot == 0 and temperature > 0

    def prefill(self, slot, ids, start, last):
        assert slot == 0 and start == 0 and last and len(ids) == 16 and max(ids) < self.cfg.vocab_size

    def set_rows(self, slots):
        self.calls.append(("eager", len(slots)))

    def run_step(self, B, replayed=False):
        self.t += 1
        ids = torch.full((B, 5), self.t + (replayed and self.drift and self.t == 3), dtype=torch.int32)
        ids[1:] = torch.randint(0, 9, (B - 1, 5))                  # padding rows' outputs are not compared
        return ids, torch.ones(B, dtype=torch.int32)

    def step(self, slots):
        assert slots == [0] + [-1] * (len(slots) - 1)
        self.calls.append(("replay", len(slots)))
        return self.run_step(len(slots), replayed=True)

    def step_logits(self, B):
        return torch.full((B, 5, 8), float(self.t))


def test_replay_check_compares_eager_and_replayed_steps():
    from capture import replay_check
    runner = StubRunner()
    assert replay_check(runner, 4, 6)
    assert runner.calls == [("eager", 4)] * 6 + [("replay", 4)] * 6
    assert not replay_check(StubRunner(drift=True), 2, 6)
