"""layers/prepared.py: a checkpoint as the kernel path's weights. Every fused linear, split as the kernel chain
splits it, gives the eager model's own projections (int4: to rounding, and exactly the dequantised per-part
quantisation; bf16: exactly); save -> load is bitwise; errors name the file and tensor; the loader holds one
source block at a time."""
import json
import os
import shutil
import weakref

import pytest
import torch
import torch.nn.functional as F

import layers.prepared as prep
from layers.checkpoint import CheckpointError, load_model
from layers.prepared import (PreparedError, attention_columns, gdn_in_proj_columns, load_prepared, mlp_columns,
                             prepare, save_prepared)
from layers.quant import Int4Weight, dequantize_int4, dequantize_int8, quantize_int4
from tests.fixtures import CONFIGS, edit_json, edit_safetensors, make_tiny_checkpoint, rel_err

DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "demo")
QUIET = lambda *a: None                                                           # noqa: E731
# int4 g128 round-to-nearest: s = 2·amax/15 ≈ 0.36σ for a group of 128 Gaussian weights, a rounding error of
# s/√12 ≈ 0.10σ, so a projection is off by ~0.10 relative (measured 0.03-0.12 here; up to 0.15 for 4-wide b, a)
INT4_TOL = 0.16

# The CONFIGS at widths int4 can hold (every linear's input a multiple of 128), their other differences kept.
INT4_WIDTHS = {
    "vl-untied": dict(hidden_size=128, intermediate_size=256, head_dim=32, linear_value_head_dim=32),
    "text-tied": dict(hidden_size=128, intermediate_size=128, num_attention_heads=4, head_dim=32,
                      linear_num_value_heads=4, linear_value_head_dim=32),
    "vl-interval2": dict(hidden_size=128, intermediate_size=128, head_dim=64, linear_value_head_dim=64),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(name, body) -> checkpoint directory: the CONFIGS as they are (bf16 body) and widened (int4 body), the demo
    model (both)."""
    out = {("demo", "int4"): DEMO, ("demo", "bf16"): DEMO}
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        out[name, "bf16"] = make_tiny_checkpoint(str(tmp_path_factory.mktemp(name)), seed=i, tokenizer=False,
                                                 **cfg)
        out[name, "int4"] = make_tiny_checkpoint(str(tmp_path_factory.mktemp(name + "-int4")), seed=i,
                                                 tokenizer=False, **{**cfg, **INT4_WIDTHS[name]})
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny")), seed=5, **INT4_WIDTHS["vl-untied"])


@pytest.fixture
def ckpt(tiny, tmp_path):
    return shutil.copytree(tiny, str(tmp_path / "ckpt"))


CASES = [(name, body) for name in [*CONFIGS, "demo"] for body in ("int4", "bf16")]


def captured(model, ids):
    """Every nn.Linear's (input, output) in one forward of the eager model and one MTP pass, by module name."""
    seen, hooks = {}, []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            hooks.append(module.register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, (i[0], o))))
    with torch.no_grad():
        hidden = model(ids)
        if model.mtp is not None:
            model.mtp_forward(ids.roll(-1, 1), hidden)
    for h in hooks:
        h.remove()
    return seen


def weight(linear) -> torch.Tensor:
    return dequantize_int4(linear) if isinstance(linear, Int4Weight) else linear.float()


@pytest.mark.parametrize("name, body", CASES)
def test_fused_linears_give_the_models_projections(checkpoints, name, body):
    """x @ W.T of each prepared linear, split in the kernel chain's column order (layers.prepared.*_columns),
    against the eager model's own projection outputs, split as layers/model.py splits them. int4: each part's
    rows are exactly the dequantised quantisation of that part alone, the projections agree to int4 rounding;
    bf16: rows are the model's weights bitwise and the projections agree to bf16 rounding."""
    model_dir = checkpoints[name, body]
    p = prepare(model_dir, "cpu", body=body, progress=QUIET)
    model = load_model(model_dir, dtype=torch.float32 if body == "int4" else torch.bfloat16)
    cfg, B, T = model.cfg, 2, 7
    params = dict(model.named_parameters())
    seen = captured(model, torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(0)))

    def check(linear, x, parts):
        """parts: (columns of the fused output, the model's weight rows, the model's output) per part."""
        w = weight(linear)
        out = F.linear(x, linear if body == "bf16" else w)
        assert out.shape[-1] == sum(cols.stop - cols.start for cols, _, _ in parts)
        for cols, w_model, y_model in parts:
            if body == "int4":
                assert torch.equal(w[cols], dequantize_int4(quantize_int4(w_model)))
                assert rel_err(out[..., cols], y_model) < INT4_TOL
            else:
                assert torch.equal(linear[cols], w_model)
                torch.testing.assert_close(out[..., cols], y_model)

    def unfused(linear, module):
        x, y = seen[module]
        check(linear, x, [(slice(0, y.shape[-1]), params[module + ".weight"], y)])

    def own(module):                               # a linear's weight and output in the eager model
        return params[module + ".weight"], seen[module][1]

    def layer(prefix, w):
        m = w.mixer
        if hasattr(m, "in_proj"):
            a = prefix + "linear_attn."
            (qkv_w, qkv_y), kd = own(a + "in_proj_qkv"), cfg.linear_key_dim
            split = [kd, kd, cfg.linear_value_dim]               # GatedDeltaNet.forward's q, k, v
            parts = dict(zip("qkv", zip(qkv_w.split(split), qkv_y.split(split, -1))))
            parts.update(z=own(a + "in_proj_z"), b=own(a + "in_proj_b"), a=own(a + "in_proj_a"))
            cols = gdn_in_proj_columns(cfg)
            assert list(cols) == list(parts)
            check(m.in_proj, seen[a + "in_proj_qkv"][0], [(cols[n], *parts[n]) for n in cols])
            unfused(m.out_proj, a + "out_proj")
            small = {"conv_weight": params[a + "conv1d.weight"][:, 0], "A_log": params[a + "A_log"],
                     "dt_bias": params[a + "dt_bias"], "norm": params[a + "norm.weight"]}
        else:
            a = prefix + "self_attn."
            cols = attention_columns(cfg)
            check(m.qkv_gate, seen[a + "q_proj"][0], [(cols["query_gate"], *own(a + "q_proj")),
                                                      (cols["k"], *own(a + "k_proj")), (cols["v"], *own(a + "v_proj"))])
            nh, d = cfg.num_attention_heads, cfg.head_dim       # GatedAttention.forward's query and gate
            x = seen[a + "q_proj"][0]
            ours = F.linear(x, m.qkv_gate if body == "bf16" else weight(m.qkv_gate))[..., cols["query_gate"]]
            for mine, theirs in zip(ours.view(B, -1, nh, 2 * d).split(d, -1),
                                    seen[a + "q_proj"][1].view(B, -1, nh, 2 * d).split(d, -1)):
                assert rel_err(mine, theirs) < (INT4_TOL if body == "int4" else 1e-2)
            unfused(m.o_proj, a + "o_proj")
            small = {"q_norm": params[a + "q_norm.weight"], "k_norm": params[a + "k_norm.weight"]}
        cols = mlp_columns(cfg)
        check(w.mlp.gate_up, seen[prefix + "mlp.gate_proj"][0],
              [(cols["gate"], *own(prefix + "mlp.gate_proj")), (cols["up"], *own(prefix + "mlp.up_proj"))])
        unfused(w.mlp.down, prefix + "mlp.down_proj")
        small.update(input_norm=params[prefix + "input_layernorm.weight"],
                     post_norm=params[prefix + "post_attention_layernorm.weight"])
        for field, value in small.items():
            mine = getattr(m, field) if hasattr(m, field) else getattr(w, field)
            assert torch.equal(mine, value.to(mine.dtype)), (prefix, field)

    for i, w in enumerate(p.layers):
        layer(f"layers.{i}.", w)
    assert p.mtp is not None and model.mtp is not None           # every checkpoint here has one
    unfused(p.mtp.fc, "mtp.fc")
    layer("mtp.layers.0.", p.mtp.layer)
    for field in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        assert torch.equal(getattr(p.mtp, field), params[f"mtp.{field}.weight"].to(torch.bfloat16))
    assert torch.equal(p.norm, params["norm.weight"].to(torch.bfloat16))
    assert rel_err(dequantize_int8(p.embed), params["embed_tokens.weight"]) < 0.01
    assert rel_err(dequantize_int8(p.lm_head), model.lm_head_weight) < 0.01
    assert (p.lm_head is p.embed) == cfg.tie_word_embeddings


def same(a, b):
    ta, tb = a.tensors(), b.tensors()
    assert list(ta) == list(tb) and a.cfg == b.cfg and a.body == b.body
    for k in ta:
        assert ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]), k


@pytest.mark.parametrize("name, body", CASES)
def test_save_load_round_trip_is_bitwise(checkpoints, name, body, tmp_path):
    """Every tensor back bitwise, in one file and in shards; a tied head stays one object; the directory holds the
    config and tokenizer files and a manifest saying what was made from what, and how."""
    model_dir = checkpoints[name, body]
    p = prepare(model_dir, "cpu", body=body, progress=QUIET)
    one = save_prepared(p, str(tmp_path / "one"), model_dir, command="prepare-test")
    same(p, load_prepared(str(tmp_path / "one")))
    size = sum(t.numel() * t.element_size() for t in p.tensors().values())
    save_prepared(p, str(tmp_path / "shards"), model_dir, shard_bytes=size // 3)
    files = sorted(f for f in os.listdir(tmp_path / "shards") if f.endswith(".safetensors"))
    assert len(files) > 1 and files[0] == f"prepared-00001-of-{len(files):05d}.safetensors"
    loaded = load_prepared(str(tmp_path / "shards"))
    same(p, loaded)
    assert (loaded.lm_head is loaded.embed) == p.cfg.tie_word_embeddings
    with open(one) as f:
        m = json.load(f)
    assert (m["format"], m["format_version"], m["body"], m["group_size"]) == ("qwen35-prepared", 1, body, 128)
    assert m["source"]["path"] == os.path.abspath(model_dir) and m["made_by"]["command"] == "prepare-test"
    assert set(m["source"]["files"]) >= {os.path.basename(f) for f in os.listdir(model_dir)
                                         if f.endswith(".safetensors")}
    assert os.path.exists(tmp_path / "one" / "config.json")


def test_prepared_directory_is_self_contained(tiny, tmp_path):
    """Config, generation config and tokenizer travel with the weights; the source may go away."""
    src = shutil.copytree(tiny, str(tmp_path / "src"))
    p = prepare(src, "cpu", progress=QUIET)
    save_prepared(p, str(tmp_path / "out"), src)
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= set(
        os.listdir(tmp_path / "out"))
    shutil.rmtree(src)
    same(p, load_prepared(str(tmp_path / "out")))


@pytest.fixture
def saved(ckpt, tmp_path):
    out = str(tmp_path / "prepared")
    save_prepared(prepare(ckpt, "cpu", progress=QUIET), out, ckpt)
    return out, os.path.join(out, "prepared-00001-of-00001.safetensors")


def edit_manifest(out, fn):
    return edit_json(os.path.join(out, "manifest.json"), fn)


def test_load_errors_name_the_file_and_tensor(saved, tmp_path):
    out, shard = saved
    edit_safetensors(shard, lambda t: t.pop("layers.0.mixer.in_proj.qweight"))
    with pytest.raises(PreparedError, match=f"{shard}: missing tensor 'layers.0.mixer.in_proj.qweight'"):
        load_prepared(out)
    edit_safetensors(shard, lambda t: t.update({"layers.0.mixer.in_proj.qweight": torch.zeros(1, 2, 16, dtype=torch.int32)}))
    with pytest.raises(PreparedError, match=rf"{shard}: tensor 'layers.0.mixer.in_proj.qweight' is I32 \[1, 2, 16\], "
                                            r"expected I32 \[1, \d+, 16\]"):
        load_prepared(out)
    edit_safetensors(shard, lambda t: t.update({"layers.0.mixer.in_proj.qweight": torch.zeros(1, 2, 16),
                                         "norm": t["norm"].float()}))
    with pytest.raises(PreparedError, match=rf"{shard}: tensor '(norm|layers.0.mixer.in_proj.qweight)' is F32"):
        load_prepared(out)
    edit_safetensors(shard, lambda t: t.update({"layers.0.extra": torch.zeros(2)}))
    with pytest.raises(PreparedError, match=f"{shard}: unexpected tensor 'layers.0.extra'"):
        load_prepared(out)
    os.remove(shard)
    with pytest.raises(PreparedError, match=f"{shard}: listed in manifest.json but missing"):
        load_prepared(out)


def test_manifest_errors(saved):
    out, _ = saved
    path = edit_manifest(out, lambda m: m.update(format_version=99))
    with pytest.raises(PreparedError, match=f"{path}: field 'format_version' is 99; this engine reads version 1"):
        load_prepared(out)
    edit_manifest(out, lambda m: m.update(format_version=1, body="int3"))
    with pytest.raises(PreparedError, match=f"{path}: field 'body' is 'int3'"):
        load_prepared(out)
    edit_manifest(out, lambda m: m.update(body="int4", format="gguf"))
    with pytest.raises(PreparedError, match=f"{path}: field 'format' is 'gguf'"):
        load_prepared(out)
    with open(path, "w") as f:
        f.write("{")
    with pytest.raises(PreparedError, match=f"{path}: cannot be read as JSON"):
        load_prepared(out)
    os.remove(path)
    with pytest.raises(PreparedError, match=f"{path}: not found"):
        load_prepared(out)


def test_a_changed_source_checkpoint_is_refused(saved, ckpt):
    """The source still there must be the one the weights came from: its weight files' sizes and times and its
    config; a source that is gone is not checked (its owner may have deleted the bf16 copy)."""
    out, _ = saved
    src = os.path.join(ckpt, "model.safetensors")
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(PreparedError, match=f"manifest.json: the source checkpoint's {src} changed"):
        load_prepared(out)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    load_prepared(out)
    with open(os.path.join(ckpt, "config.json"), "a") as f:
        f.write(" ")
    with pytest.raises(PreparedError, match=f"source checkpoint's {ckpt}/config.json changed"):
        load_prepared(out)
    shutil.rmtree(ckpt)
    load_prepared(out)


def test_prepare_errors_name_the_file_and_tensor(checkpoints, ckpt):
    narrow = checkpoints["vl-untied", "bf16"]          # hidden 64: no int4 layout
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor 'model.language_model.layers.0\.[\w.]+"
                                              r"\.weight' has 64 inputs, not a multiple of 128.*"
                                              r"body='bf16'"):
        prepare(narrow, "cpu", progress=QUIET)
    with pytest.raises(ValueError, match="body must be one of"):
        prepare(ckpt, "cpu", body="int8", progress=QUIET)
    path = os.path.join(ckpt, "model.safetensors")
    key = "model.language_model.layers.0.linear_attn.dt_bias"
    edit_safetensors(path, lambda t: t.update({key: t[key].to(torch.int32)}))
    with pytest.raises(CheckpointError, match=f"{path}: tensor '{key}' has dtype I32"):
        prepare(ckpt, "cpu", progress=QUIET)
    edit_safetensors(path, lambda t: t.update({key: t[key].float()}))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 1000)
    with pytest.raises(CheckpointError, match=path):
        prepare(ckpt, "cpu", progress=QUIET)


def test_no_mtp(ckpt):
    assert prepare(ckpt, "cpu", progress=QUIET, with_mtp=False).mtp is None
    edit_safetensors(os.path.join(ckpt, "model.safetensors"), lambda t: [t.pop(k) for k in list(t) if k.startswith("mtp.")])
    with pytest.warns(UserWarning, match="no mtp"):
        assert prepare(ckpt, "cpu", progress=QUIET).mtp is None


def test_one_source_block_at_a_time_and_progress(ckpt, monkeypatch, capsys):
    """The loader reads source data only through read_rows, in blocks of at most CHUNK_ELEMENTS (or one row), and
    each block is gone before the next is read: the unquantised data alive at once is one block. Blocks give the
    same weights as whole tensors. Progress counts tensors and bytes up to the totals."""
    whole = prepare(ckpt, "cpu", progress=QUIET)
    monkeypatch.setattr(prep, "CHUNK_ELEMENTS", 1000)
    alive, blocks, read = [], [], prep.read_rows

    def tracked(f, key, start, stop):
        assert all(ref() is None for ref in alive), "a previous source block is still alive"
        block = read(f, key, start, stop)
        alive.append(weakref.ref(block))
        row = block[0].numel()
        blocks.append((key, start, stop, block.numel()))
        assert block.numel() <= max(1000, row)
        return block

    monkeypatch.setattr(prep, "read_rows", tracked)
    calls = []
    chunked = prepare(ckpt, "cpu", progress=lambda *a: calls.append(a))
    same(whole, chunked)
    assert len(blocks) > len({k for k, *_ in blocks})                 # big tensors did come in several blocks
    done, total, nbytes, total_bytes = calls[-1]
    assert done == total and nbytes == total_bytes == sum(4 * n for *_, n in blocks)    # an fp32 checkpoint
    assert all(a[0] <= b[0] and a[2] <= b[2] for a, b in zip(calls, calls[1:]))

    monkeypatch.undo()
    prepare(ckpt, "cpu")
    err = capsys.readouterr().err
    gb = f"{total_bytes / 1e9:.2f}"
    assert err.startswith("\rpreparing weights: ") and err.endswith(f"{total}/{total} tensors, {gb}/{gb} GB\n")


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
def test_the_kernels_take_the_prepared_weights(tiny):
    """The int4 linear and the int8 embedding / lm_head (kernels/, in Triton's interpreter on the CPU) read the
    prepared tensors as they are and give the dequantised reference."""
    from kernels.int4 import int4_linear
    from kernels.int8 import int8_embedding, int8_linear
    p = prepare(tiny, "cpu", progress=QUIET)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, p.cfg.vocab_size, (3,), generator=gen)
    x = int8_embedding(ids, p.embed)
    assert rel_err(x, dequantize_int8(p.embed)[ids]) < 4e-3
    for linear in (p.layers[0].mixer.in_proj, p.layers[3].mixer.qkv_gate, p.layers[0].mlp.down, p.mtp.fc):
        xi = torch.randn(3, linear.k, generator=gen).to(torch.bfloat16)
        out = int4_linear(xi, linear, out=torch.empty(3, linear.n))
        assert rel_err(out, xi.float() @ dequantize_int4(linear).T) < 4e-3
    logits = int8_linear(x, p.lm_head, out=torch.empty(3, p.cfg.vocab_size))
    assert rel_err(logits, x.float() @ dequantize_int8(p.lm_head).T) < 4e-3


def test_command_line(tiny, tmp_path, capsys):
    """python -m layers.prepared MODEL OUT: prepares, saves, prints the manifest's path; errors: one line."""
    out = str(tmp_path / "out")
    prep.main([tiny, out, "--device", "cpu", "--body", "bf16"])
    assert capsys.readouterr().out.strip() == os.path.join(out, "manifest.json")
    assert load_prepared(out).body == "bf16"
    with pytest.raises(SystemExit, match=f"error: {tmp_path}/missing/config.json: not found"):
        prep.main([str(tmp_path / "missing"), out, "--device", "cpu"])
