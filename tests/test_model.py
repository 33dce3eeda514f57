"""The plain-torch model against transformers on three tiny configurations (float32, max relative error 1e-4):
prefill, token-by-token decode, chunked prefill continuing from a cache, and the MTP layer against one assembled
from transformers' own decoder layer and norms."""
import pytest
import torch

from kernels.gdn.ref import delta_rule_chunked_ref, delta_rule_recurrent_ref
from layers.checkpoint import load_model
from tests.fixtures import CONFIGS, make_tiny_checkpoint, reference_model


def rel_err(out, ref):
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    model_dir = make_tiny_checkpoint(str(tmp_path_factory.mktemp(request.param)), seed=3, **CONFIGS[request.param])
    return reference_model(model_dir), load_model(model_dir, dtype=torch.float32)


def test_prefill_matches_transformers(pair):
    ref, ours = pair
    ids = torch.randint(0, 300, (2, 150), generator=torch.Generator().manual_seed(0))   # > 2 GDN chunks of 64
    with torch.no_grad():
        assert rel_err(ours.logits(ours(ids)), ref(ids).logits) < 1e-4


def test_decode_and_chunked_prefill_match_transformers(pair):
    ref, ours = pair
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = ref(ids).logits
        cache = ours.new_cache(2, 64)
        steps = [ours.logits(ours(ids[:, :7], cache))]
        steps += [ours.logits(ours(ids[:, t:t + 1], cache)) for t in range(7, 20)]   # token by token
        steps.append(ours.logits(ours(ids[:, 20:], cache)))                          # a chunk from the cache
    assert rel_err(torch.cat(steps, 1), full) < 1e-4


def test_verify_pass_commits_any_prefix(pair):
    """A provisional multi-token pass followed by commit(n) leaves the caches as if only n tokens were fed."""
    _, ours = pair
    ids = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for n in (1, 3, 5):
            cache, plain = ours.new_cache(1, 64), ours.new_cache(1, 64)
            ours(ids[:, :12], cache)
            ours(ids[:, :12], plain)
            ours(ids[:, 12:17], cache, keep_states=True)
            cache.commit(n)
            ours(ids[:, 12:12 + n], plain)
            a, b = ours.logits(ours(ids[:, 20:], cache)), ours.logits(ours(ids[:, 20:], plain))
            assert cache.length == plain.length == 16 + n
            assert rel_err(a, b) < 1e-5


def test_mtp_matches_transformers_blocks(pair, tmp_path):
    """MODEL.md §5: fc(cat[norm(embed), norm(hidden)]) -> a transformers Qwen3_5DecoderLayer -> norm, with our
    weights copied in; checked over a multi-row pass and a cached continuation."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import (Qwen3_5DecoderLayer, Qwen3_5RMSNorm,
                                                              Qwen3_5TextRotaryEmbedding)
    ref, ours = pair
    cfg = ref.config
    layer = Qwen3_5DecoderLayer(cfg, cfg.layer_types.index("full_attention")).eval()
    layer.load_state_dict({k[len("layers.0."):]: v for k, v in ours.mtp.state_dict().items() if k.startswith("layers.0.")})
    norms = {}
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        norms[name] = Qwen3_5RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        norms[name].weight.data.copy_(getattr(ours.mtp, name).weight)
    rotary = Qwen3_5TextRotaryEmbedding(cfg)

    def reference(next_ids, hidden):
        e = ref.model.embed_tokens(next_ids)
        x = torch.nn.functional.linear(torch.cat([norms["pre_fc_norm_embedding"](e), norms["pre_fc_norm_hidden"](hidden)], -1),
                                       ours.mtp.fc.weight)
        T = x.shape[1]
        pos = torch.arange(T)[None, None].expand(3, 1, T)          # text: the three MRoPE streams are equal
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        return norms["norm"](layer(x, position_embeddings=rotary(x, pos), attention_mask=mask))

    g = torch.Generator().manual_seed(5)
    next_ids = torch.randint(0, 300, (1, 9), generator=g)
    hidden = torch.randn(1, 9, cfg.hidden_size, generator=g)
    with torch.no_grad():
        want = reference(next_ids, hidden)
        assert rel_err(ours.mtp_forward(next_ids, hidden), want) < 1e-4
        cache = ours.new_cache(1, 16)
        got = torch.cat([ours.mtp_forward(next_ids[:, :6], hidden[:, :6], cache),
                         ours.mtp_forward(next_ids[:, 6:], hidden[:, 6:], cache)], 1)
        assert rel_err(got, want) < 1e-4


@pytest.mark.parametrize("T", [1, 5, 64, 130])
def test_chunked_delta_rule_equals_recurrent(T):
    g = torch.Generator().manual_seed(T)
    B, H, dk, dv = 2, 3, 8, 12
    q = torch.nn.functional.normalize(torch.randn(B, T, H, dk, generator=g, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, dk, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, H, dv, generator=g, dtype=torch.float64)
    gate = -torch.rand(B, T, H, generator=g, dtype=torch.float64) * 2
    beta = torch.rand(B, T, H, generator=g, dtype=torch.float64)
    s0 = torch.randn(B, H, dk, dv, generator=g, dtype=torch.float64)
    o_ref, states = delta_rule_recurrent_ref(q, k, v, gate, beta, s0)
    o, final = delta_rule_chunked_ref(q, k, v, gate, beta, s0, chunk=16)
    assert rel_err(o, o_ref) < 1e-10 and rel_err(final, states[-1]) < 1e-10
