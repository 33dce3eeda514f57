"""A checkpoint turned into the weights the kernel path reads (bench/layer_step.py, bench/step.py), and those
weights saved once and loaded directly on later starts.

prepare(model_dir, device, body) streams a bf16 / fp16 / fp32 checkpoint (layers/checkpoint.py checks every
header first) into a PreparedModel allocated up front on `device`: each body linear is quantised to the int4
group-128 mma layout (layers/quant.py: Int4Weight, symmetric, fp16 scales) in blocks of at most CHUNK_ELEMENTS
source elements read from the file, moved to the device, quantised there and written into its place. Peak memory
is the prepared model plus one block and its quantiser's temporaries, never a whole bf16 model (nor a whole bf16
embedding). embed_tokens and lm_head become int8 per row (Int8Weight, fp16 scales; tied: one object, both
fields). body="bf16" keeps the body linears in bf16 (small models, checking). Norm weights, conv weights, A_log
and dt_bias are copied: A_log and the GDN output norm in fp32, the rest in bf16 (as layers/checkpoint.py loads
them for a bf16 model).

Fused linears, their output columns (weight rows) in the order the kernel chain slices them (gdn_in_proj_columns,
attention_columns, mlp_columns), and the checkpoint tensors filling them in that order:
  GDN in_proj    [q Hk·dk | k Hk·dk | v Hv·dv | z Hv·dv | b Hv | a Hv]  in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
                 q|k|v is the conv input (channel c = column c); b and a one column per value head
  attn qkv_gate  [query_gate 2·nh·d | k nkv·d | v nkv·d]                q_proj, k_proj, v_proj
                 query_gate keeps q_proj's per-head interleaving, head h = columns 2dh … 2dh+2d as [q_h | gate_h]
                 (kernels/norms.qk_norm_rope reads it so)
  MLP gate_up    [gate I | up I]                                        gate_proj, up_proj
The Qwen3.5 checkpoint holds these projections separately and already in this order: preparing concatenates rows
and permutes none. Unfused: GDN out_proj, attention o_proj, MLP down, MTP fc (input [embedding | hidden]). The
conv weight is [C, K] (the checkpoint's [C, 1, K]).

`build` is prepare's filling loop over any source of rows: tools/random_model.py feeds it generated blocks, so a
random model passes through the same quantisation as a checkpoint.

save_prepared writes the tensors as safetensors shards (PreparedModel.tensors() names) plus manifest.json (format
version, source checkpoint and its fingerprint — or {"random": "random, seed N"} —, body, group size, how and when
made, tensor → file) and the checkpoint's config and tokenizer files, so the directory is all a later start
needs; load_prepared checks all of it before reading a tensor and errors name the file and tensor (or field) that
is wrong. A source checkpoint still on disk must be unchanged (config.json's hash, each weight file's size and
mtime); one deleted since (or random weights: none) is not asked for."""
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from layers.checkpoint import CheckpointError, by_file, checked_headers, shard_files
from layers.config import ModelConfig
from layers.quant import BLOCK_K, GROUP, Int4Weight, Int8Weight, quantize_int4, quantize_int8_rows

FORMAT, FORMAT_VERSION = "qwen35-prepared", 1
MANIFEST = "manifest.json"
BODIES = ("int4", "bf16")
SOURCE_DTYPES = ("F32", "F16", "BF16")     # checkpoint dtypes prepare reads
SCALE_DTYPE = torch.float16
CHUNK_ELEMENTS = 1 << 23          # source elements quantised at a time (8M: ~0.4 GB of quantiser temporaries)
SHARD_BYTES = 2 << 30             # a saved shard's size limit (host memory while saving: one shard)
DRAFT_VOCAB = "draft_vocab.safetensors"   # a reduced draft vocabulary: tensor "used_tokens" (load_draft_vocab)
COMPANIONS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "chat_template.jinja", DRAFT_VOCAB)      # copied beside the prepared weights
BODY_LINEARS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "q_proj", "k_proj", "v_proj",
                "o_proj", "gate_proj", "up_proj", "down_proj", "fc")
DTYPE_NAMES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int32: "I32",
               torch.int8: "I8"}

Linear = Union[Int4Weight, torch.Tensor]       # int4 body, or bf16 [N, K] with body="bf16"


class PreparedError(CheckpointError):
    pass


@dataclass
class GDNWeights:
    in_proj: Linear             # [q | k | v | z | b | a] × H (gdn_in_proj_columns)
    out_proj: Linear            # H × Hv·dv
    conv_weight: torch.Tensor   # bf16 [C, K], C = 2·Hk·dk + Hv·dv
    A_log: torch.Tensor         # fp32 [Hv]
    dt_bias: torch.Tensor       # bf16 [Hv]
    norm: torch.Tensor          # fp32 [dv], plain w (gated RMSNorm)


@dataclass
class AttentionWeights:
    qkv_gate: Linear            # [query_gate | k | v] × H (attention_columns)
    o_proj: Linear              # H × nh·d
    q_norm: torch.Tensor        # bf16 [d], 1 + w
    k_norm: torch.Tensor        # bf16 [d], 1 + w


@dataclass
class MLPWeights:
    gate_up: Linear             # [gate | up] × H
    down: Linear                # H × I


@dataclass
class LayerWeights:
    input_norm: torch.Tensor    # bf16 [H], 1 + w
    mixer: Union[GDNWeights, AttentionWeights]
    post_norm: torch.Tensor     # bf16 [H], 1 + w
    mlp: MLPWeights


@dataclass
class MTPWeights:
    fc: Linear                  # H × 2H, input [norm(embedding) | norm(hidden)]
    pre_fc_norm_embedding: torch.Tensor
    pre_fc_norm_hidden: torch.Tensor
    layer: LayerWeights         # a gated-attention decoder layer
    norm: torch.Tensor


@dataclass
class PreparedModel:
    cfg: ModelConfig
    body: str                   # "int4" | "bf16"
    embed: Int8Weight           # [V, H]
    lm_head: Int8Weight         # [V, H]; the embed object itself when tied
    norm: torch.Tensor          # bf16 [H], the final norm
    layers: list                # LayerWeights, one per decoder layer
    mtp: Optional[MTPWeights]

    def tensors(self) -> dict:
        """Flat name → tensor: field paths joined by '.', list items by index ('layers.3.mixer.qkv_gate.qweight');
        a tied lm_head appears once, as embed."""
        out = {}

        def walk(prefix, obj):
            if isinstance(obj, torch.Tensor):
                out[prefix] = obj
            elif isinstance(obj, list):
                for i, item in enumerate(obj):
                    walk(f"{prefix}.{i}", item)
            elif dataclasses.is_dataclass(obj):
                for field in dataclasses.fields(obj):
                    walk(f"{prefix}.{field.name}" if prefix else field.name, getattr(obj, field.name))

        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not (field.name == "lm_head" and value is self.embed) and field.name not in ("cfg", "body"):
                walk(field.name, value)
        return out


def _columns(parts) -> dict:
    out, start = {}, 0
    for name, width in parts:
        out[name] = slice(start, start + width)
        start += width
    return out


def gdn_in_proj_columns(cfg: ModelConfig) -> dict:
    """name → slice of the GDN in_proj output: q, k, v (together the conv input), z, b, a."""
    kd, vd, hv = cfg.linear_key_dim, cfg.linear_value_dim, cfg.linear_num_value_heads
    return _columns([("q", kd), ("k", kd), ("v", vd), ("z", vd), ("b", hv), ("a", hv)])


def attention_columns(cfg: ModelConfig) -> dict:
    """name → slice of the attention qkv_gate output: query_gate (per head [q_h | gate_h]), k, v."""
    nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    return _columns([("query_gate", 2 * nh * d), ("k", nkv * d), ("v", nkv * d)])


def mlp_columns(cfg: ModelConfig) -> dict:
    return _columns([("gate", cfg.intermediate_size), ("up", cfg.intermediate_size)])


# ------------------------------------------------------------------------------------------------ allocation
def _allocate(cfg: ModelConfig, body: str, mtp: bool, device) -> PreparedModel:
    """Every tensor of the prepared model, uninitialised, at its final shape and dtype."""
    bf = dict(dtype=torch.bfloat16, device=device)

    def linear(n, k):
        if body == "bf16":
            return torch.empty(n, k, **bf)
        return Int4Weight(torch.empty(k // BLOCK_K, n, 16, dtype=torch.int32, device=device),
                          torch.empty(k // GROUP, n, dtype=SCALE_DTYPE, device=device))

    def vec(n, dtype=torch.bfloat16):
        return torch.empty(n, dtype=dtype, device=device)

    def int8(n, k):
        return Int8Weight(torch.empty(n, k, dtype=torch.int8, device=device), vec(n, SCALE_DTYPE))

    H, I, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim

    def layer(kind):
        if kind == "full_attention":
            nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
            mixer = AttentionWeights(linear(2 * nh * d + 2 * nkv * d, H), linear(H, nh * d), vec(d), vec(d))
        else:
            hv, c = cfg.linear_num_value_heads, cfg.linear_conv_dim
            mixer = GDNWeights(linear(c + cfg.linear_value_dim + 2 * hv, H), linear(H, cfg.linear_value_dim),
                               torch.empty(c, cfg.linear_conv_kernel_dim, **bf), vec(hv, torch.float32), vec(hv),
                               vec(cfg.linear_value_head_dim, torch.float32))
        return LayerWeights(vec(H), mixer, vec(H), MLPWeights(linear(2 * I, H), linear(H, I)))

    embed = int8(cfg.vocab_size, H)
    lm_head = embed if cfg.tie_word_embeddings else int8(cfg.vocab_size, H)
    mtp_weights = MTPWeights(linear(H, 2 * H), vec(H), vec(H), layer("full_attention"), vec(H)) if mtp else None
    return PreparedModel(cfg, body, embed, lm_head, vec(H), [layer(t) for t in cfg.layer_types], mtp_weights)


def _targets(p: PreparedModel, shapes: dict) -> dict:
    """Checkpoint parameter name (layers/checkpoint.model_name) → (destination, its first row). Fused linears'
    parts follow each other in column order; `shapes` (name → shape) gives their widths."""
    out = {"embed_tokens.weight": (p.embed, 0), "norm.weight": (p.norm, 0)}
    if p.lm_head is not p.embed:
        out["lm_head.weight"] = (p.lm_head, 0)

    def fused(dest, names):
        row = 0
        for name in names:
            out[name] = (dest, row)
            row += shapes[name][0]

    def layer(prefix, w: LayerWeights):
        out[prefix + "input_layernorm.weight"] = (w.input_norm, 0)
        out[prefix + "post_attention_layernorm.weight"] = (w.post_norm, 0)
        m = w.mixer
        if isinstance(m, AttentionWeights):
            a = prefix + "self_attn."
            fused(m.qkv_gate, [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"])
            out.update({a + "o_proj.weight": (m.o_proj, 0), a + "q_norm.weight": (m.q_norm, 0),
                        a + "k_norm.weight": (m.k_norm, 0)})
        else:
            a = prefix + "linear_attn."
            fused(m.in_proj, [a + n + ".weight" for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")])
            out.update({a + "out_proj.weight": (m.out_proj, 0), a + "conv1d.weight": (m.conv_weight, 0),
                        a + "A_log": (m.A_log, 0), a + "dt_bias": (m.dt_bias, 0), a + "norm.weight": (m.norm, 0)})
        fused(w.mlp.gate_up, [prefix + "mlp.gate_proj.weight", prefix + "mlp.up_proj.weight"])
        out[prefix + "mlp.down_proj.weight"] = (w.mlp.down, 0)

    for i, w in enumerate(p.layers):
        layer(f"layers.{i}.", w)
    if p.mtp is not None:
        out.update({"mtp.fc.weight": (p.mtp.fc, 0), "mtp.norm.weight": (p.mtp.norm, 0),
                    "mtp.pre_fc_norm_embedding.weight": (p.mtp.pre_fc_norm_embedding, 0),
                    "mtp.pre_fc_norm_hidden.weight": (p.mtp.pre_fc_norm_hidden, 0)})
        layer("mtp.layers.0.", p.mtp.layer)
    return out


# ------------------------------------------------------------------------------------------------ progress
def stderr_progress(label: str = "preparing weights") -> Callable:
    """The default progress callback: one line on stderr, rewritten at most 5 times a second and when done."""
    last = [0.0]

    def report(done, total, nbytes, total_bytes):
        now = time.monotonic()
        finished = done == total
        if not finished and now - last[0] < 0.2:
            return
        last[0] = now
        sys.stderr.write(f"\r{label}: {done}/{total} tensors, {nbytes / 1e9:.2f}/{total_bytes / 1e9:.2f} GB"
                         + ("\n" if finished else ""))
        sys.stderr.flush()
    return report


# ------------------------------------------------------------------------------------------------ prepare
def read_rows(f, key: str, start: int, stop: int) -> torch.Tensor:
    """Rows start…stop of a checkpoint tensor, read from the file (the only place prepare reads source data)."""
    return f.get_slice(key)[start:stop]


def _file_rows(f, path, key):
    """rows(start, stop) of a checkpoint tensor, a read failure (truncated or corrupt data) naming file and tensor."""
    def rows(start, stop):
        try:
            return read_rows(f, key, start, stop)
        except Exception as e:
            raise CheckpointError(f"{path}: tensor '{key}' could not be read: {e}") from None
    return rows


def _fill(rows, shape, dest, row0, device, on_block):
    """Stream one source tensor into its destination, CHUNK_ELEMENTS at a time: rows(start, stop) gives a block of
    its rows (bf16 / fp16 / fp32, any device); on_block(bytes) after each."""
    step = max(1, CHUNK_ELEMENTS // max(1, int(torch.Size(shape[1:]).numel())))
    for start in range(0, shape[0], step):
        stop = min(shape[0], start + step)
        block = rows(start, stop)
        nbytes = block.numel() * block.element_size()
        block = block.to(device)
        a, b = row0 + start, row0 + stop
        if isinstance(dest, Int4Weight):
            q = quantize_int4(block, GROUP, sym=True, scale_dtype=SCALE_DTYPE)
            dest.qweight[:, a:b] = q.qweight
            dest.scales[:, a:b] = q.scales
        elif isinstance(dest, Int8Weight):
            q = quantize_int8_rows(block, SCALE_DTYPE)
            dest.qweight[a:b] = q.qweight
            dest.scales[a:b] = q.scales
        else:
            dest[a:b] = block.reshape(dest[a:b].shape)
        del block
        on_block(nbytes)


def build(cfg: ModelConfig, body: str, mtp: bool, device, tensors: dict, sources, progress: Callable = None,
          where: dict = None) -> PreparedModel:
    """A PreparedModel of cfg on `device` filled from a source: tensors {parameter name: (shape, source bytes)}
    (exactly the parameters to fill, a tied head's lm_head left out), sources yielding (name, rows) in any order,
    rows(start, stop) a block of that parameter's rows — a checkpoint file's (prepare) or generated ones
    (tools/random_model.py). where: name -> how errors name the tensor (default "tensor 'name'"). progress as
    prepare's."""
    if body not in BODIES:
        raise ValueError(f"body must be one of {BODIES}, got {body!r}")
    where = where or {}
    for name, (shape, _) in tensors.items():
        if body == "int4" and name.rpartition(".")[0].endswith(BODY_LINEARS) and shape[1] % BLOCK_K:
            raise CheckpointError(f"{where.get(name, f'tensor {name!r}')} has {shape[1]} inputs, not a multiple of "
                                  f"{BLOCK_K}: the int4 layout cannot hold it (prepare with body='bf16')")
    prepared = _allocate(cfg, body, mtp, device)
    targets = _targets(prepared, {n: shape for n, (shape, _) in tensors.items()})
    assert set(targets) == set(tensors), set(targets) ^ set(tensors)

    report = progress or stderr_progress()
    total, total_bytes, done, nbytes = len(tensors), sum(n for _, n in tensors.values()), [0], [0]

    def on_block(n):
        nbytes[0] += n
        report(done[0], total, nbytes[0], total_bytes)

    with torch.no_grad():
        for name, rows in sources:
            dest, row0 = targets[name]
            _fill(rows, tensors[name][0], dest, row0, device, on_block)
            done[0] += 1
            report(done[0], total, nbytes[0], total_bytes)
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()              # the quantiser's temporaries: the memory plan counts what is left
    return prepared


def prepare(model_dir: str, device="cpu", body: str = "int4", progress: Callable = None,
            with_mtp: bool = True) -> PreparedModel:
    """The checkpoint at model_dir as a PreparedModel on `device` (see the module docstring). progress(tensors
    done, tensors total, bytes read, bytes total) is called after each block read; default: stderr_progress()."""
    if body not in BODIES:
        raise ValueError(f"body must be one of {BODIES}, got {body!r}")
    model, found = checked_headers(model_dir, with_mtp, dtypes=SOURCE_DTYPES)
    tensors = {name: (shape, torch.Size(shape).numel() * {"F32": 4}.get(dtype, 2))
               for name, (_, _, shape, dtype) in found.items()}

    def sources():
        for path, items in by_file(found).items():
            with safe_open(path, framework="pt") as f:
                for name, key, _, _ in items:
                    yield name, _file_rows(f, path, key)

    return build(model.cfg, body, model.mtp is not None, device, tensors, sources(), progress,
                 where={name: f"{path}: tensor '{key}'" for name, (path, key, _, _) in found.items()})


# ------------------------------------------------------------------------------------------------ save / load
def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def source_fingerprint(model_dir: str) -> dict:
    """What identifies a checkpoint's weights without reading them: config.json's hash, each weight file's size
    and modification time."""
    files = shard_files(model_dir)
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        files.append(index)
    stats = {os.path.basename(p): os.stat(p) for p in files}
    return {"path": os.path.abspath(model_dir),
            "config_sha256": _sha256(os.path.join(model_dir, "config.json")),
            "files": {name: {"size": s.st_size, "mtime_ns": s.st_mtime_ns} for name, s in sorted(stats.items())}}


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def save_prepared(prepared: PreparedModel, out_dir: str, source_dir: str, command: str = None,
                  shard_bytes: int = SHARD_BYTES, source: dict = None) -> str:
    """Write prepared-XXXXX-of-YYYYY.safetensors (shards of at most shard_bytes, a larger tensor alone), the
    checkpoint's config / tokenizer files, and manifest.json last (a directory without it is not a prepared
    model). command: how it was made, for the manifest (default: this process's command line). source: the
    manifest's source entry (default: source_fingerprint(source_dir); weights made without a checkpoint:
    {"random": "random, seed N"}, companion files still copied from source_dir). Returns the manifest's path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, MANIFEST)
    if os.path.exists(path):
        os.remove(path)                       # until the new one is written, the directory is not a prepared model
    for name in COMPANIONS:
        src, dst = os.path.join(source_dir, name), os.path.join(out_dir, name)
        if os.path.exists(src) and not (os.path.exists(dst) and os.path.samefile(src, dst)):
            shutil.copyfile(src, dst)
    shards, size = [[]], 0
    for name, t in prepared.tensors().items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, t))
        size += n
    weight_map = {}
    for i, items in enumerate(shards):
        fname = f"prepared-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({name: t.detach().cpu().contiguous() for name, t in items}, os.path.join(out_dir, fname),
                  metadata={"format": "pt", FORMAT: str(FORMAT_VERSION)})
        weight_map.update({name: fname for name, _ in items})
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "source": source if source is not None else source_fingerprint(source_dir),
        "body": prepared.body, "group_size": GROUP, "scale_dtype": DTYPE_NAMES[SCALE_DTYPE],
        "mtp": prepared.mtp is not None,
        "made_by": {"function": "layers.prepared.prepare, save_prepared",
                    "command": command if command is not None else " ".join([sys.executable] + sys.argv)},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "weight_map": weight_map,
    }
    _write_json(path, manifest)
    return path


def read_manifest(prepared_dir: str) -> dict:
    """manifest.json of a prepared directory, its fields checked; PreparedError naming the field otherwise."""
    path = os.path.join(prepared_dir, MANIFEST)
    try:
        with open(path) as f:
            m = json.load(f)
    except FileNotFoundError:
        raise PreparedError(f"{path}: not found ({prepared_dir!r} is not a directory of prepared weights; "
                            "write one with layers.prepared.save_prepared)") from None
    except (OSError, ValueError) as e:
        raise PreparedError(f"{path}: cannot be read as JSON: {e}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise PreparedError(f"{path}: field 'format' is {m.get('format') if isinstance(m, dict) else m!r}, "
                            f"expected {FORMAT!r}")
    if m.get("format_version") != FORMAT_VERSION:
        raise PreparedError(f"{path}: field 'format_version' is {m.get('format_version')!r}; this engine reads "
                            f"version {FORMAT_VERSION}: prepare the weights again from the checkpoint")
    checks = {"body": m.get("body") in BODIES, "group_size": m.get("group_size") == GROUP,
              "scale_dtype": m.get("scale_dtype") == DTYPE_NAMES[SCALE_DTYPE],
              "mtp": isinstance(m.get("mtp"), bool), "weight_map": isinstance(m.get("weight_map"), dict),
              "source": isinstance(m.get("source"), dict) and (isinstance(m["source"].get("path"), str)
                                                             or isinstance(m["source"].get("random"), str))}
    for field, ok in checks.items():
        if not ok:
            raise PreparedError(f"{path}: field '{field}' is {m.get(field)!r}, not what this engine reads")
    return m


def _check_source(manifest: dict, path: str):
    """A source checkpoint still present must be the one the weights were made from (gone: nothing to check)."""
    source = manifest["source"]
    if "path" not in source or not os.path.isdir(source["path"]):       # random weights, or the source is gone
        return
    now = source_fingerprint(source["path"])
    if now["config_sha256"] != source.get("config_sha256"):
        raise PreparedError(f"{path}: the source checkpoint's {os.path.join(source['path'], 'config.json')} "
                            "changed since these weights were prepared: prepare them again")
    for name in sorted(set(now["files"]) | set(source.get("files", {}))):
        if now["files"].get(name) != source["files"].get(name):
            raise PreparedError(f"{path}: the source checkpoint's {os.path.join(source['path'], name)} changed "
                                f"since these weights were prepared (was {source['files'].get(name)}, now "
                                f"{now['files'].get(name)}): prepare them again")


def load_prepared(prepared_dir: str, device="cpu") -> PreparedModel:
    """The PreparedModel save_prepared wrote, on `device`, bitwise. Every header is checked against the shapes
    and dtypes the config and manifest imply before any tensor is read."""
    m = read_manifest(prepared_dir)
    manifest_path = os.path.join(prepared_dir, MANIFEST)
    _check_source(m, manifest_path)
    cfg = ModelConfig.from_dir(prepared_dir)
    prepared = _allocate(cfg, m["body"], m["mtp"], device)
    expected = prepared.tensors()
    files = sorted(set(m["weight_map"].values()))
    found = {}
    for fname in files:
        path = os.path.join(prepared_dir, fname)
        if not os.path.isfile(path):
            raise PreparedError(f"{path}: listed in {MANIFEST} but missing")
        try:
            with safe_open(path, framework="pt") as f:
                for key in f.keys():
                    s = f.get_slice(key)
                    found[key] = (path, tuple(s.get_shape()), s.get_dtype())
        except SafetensorError as e:
            raise PreparedError(f"{path}: unreadable safetensors file: {e}") from None
    for key, (path, shape, dtype) in found.items():
        if key not in expected:
            raise PreparedError(f"{path}: unexpected tensor '{key}' (not part of a {m['body']} prepared model of "
                                "this config)")
        want = expected[key]
        if shape != tuple(want.shape) or dtype != DTYPE_NAMES[want.dtype]:
            raise PreparedError(f"{path}: tensor '{key}' is {dtype} {list(shape)}, expected "
                                f"{DTYPE_NAMES[want.dtype]} {list(want.shape)}")
    for key in expected:
        if key not in found:
            where = m["weight_map"].get(key)
            raise PreparedError(f"{os.path.join(prepared_dir, where) if where else manifest_path}: "
                                f"missing tensor '{key}'")
    for fname in files:
        path = os.path.join(prepared_dir, fname)
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                try:
                    tensor = f.get_tensor(key)
                except Exception as e:
                    raise PreparedError(f"{path}: tensor '{key}' could not be read: {e}") from None
                expected[key].copy_(tensor)
    return prepared


def saved_weight_bytes(model_dir: str) -> Optional[int]:
    """A prepared directory's weights as saved (the bytes load_prepared puts on the device); None for a
    checkpoint (no manifest)."""
    if not os.path.isfile(os.path.join(model_dir, MANIFEST)):
        return None
    files = set(read_manifest(model_dir)["weight_map"].values())
    return sum(os.path.getsize(os.path.join(model_dir, f)) for f in files)


def load_draft_vocab(model_dir: str, vocab_size: int) -> Optional[torch.Tensor]:
    """The reduced draft vocabulary of a checkpoint or prepared directory (QUANT.md §5), or None without one:
    DRAFT_VOCAB's tensor "used_tokens", the target ids the MTP drafts from (int32 / int64 [Vd], sorted, distinct,
    in [0, vocab_size)); the draft head is those rows of the lm_head. Errors name the file and tensor."""
    path = os.path.join(model_dir, DRAFT_VOCAB)
    if not os.path.isfile(path):
        return None
    try:
        with safe_open(path, framework="pt") as f:
            if "used_tokens" not in f.keys():
                raise PreparedError(f"{path}: no tensor 'used_tokens' (the draft vocabulary's target ids)")
            ids = f.get_tensor("used_tokens")
    except SafetensorError as e:
        raise PreparedError(f"{path}: not a readable safetensors file: {e}") from None
    if ids.dtype not in (torch.int32, torch.int64) or ids.dim() != 1 or not len(ids):
        raise PreparedError(f"{path}: tensor 'used_tokens' must be a non-empty 1-D int32/int64 tensor, got "
                            f"{ids.dtype} {tuple(ids.shape)}")
    ids = ids.long()
    if not bool((ids[1:] > ids[:-1]).all()) or int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
        raise PreparedError(f"{path}: tensor 'used_tokens' must hold sorted distinct token ids in [0, {vocab_size})")
    return ids


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description="Prepare a checkpoint's weights for the kernel path once and save "
                                             "them (layers/prepared.py); later starts load them directly.")
    ap.add_argument("model", help="checkpoint directory (bf16 / fp16 / fp32 safetensors)")
    ap.add_argument("out", help="directory to write the prepared weights to")
    ap.add_argument("--body", choices=BODIES, default="int4", help="body linears: int4 g128 (default) or bf16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where to quantise (default: cuda when there is one)")
    args = ap.parse_args(argv)
    try:
        prepared = prepare(args.model, args.device, body=args.body)
        print(save_prepared(prepared, args.out, args.model))
    except (CheckpointError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
