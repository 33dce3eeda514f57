"""Train the demo model (models/demo/): a ~10 M parameter Qwen3.5-architecture model on CPython's standard library.

    python -m tools.demo.train --device cpu --minutes 50          # about an hour on a laptop CPU
    python -m tools.demo.train --device cuda --minutes 6           # what made the committed checkpoint

Steps: (1) tools.demo.corpus prepares the tokenizer and token streams in --work (skipped when already there);
(2) plain-torch training of layers.model.Qwen35Model with AdamW, linear warm-up + cosine decay, on random windows
of the train split; the loss is next-token cross-entropy plus the MTP layer's losses for the next-next token
and, chaining the MTP on its own normed output as drafting does (MODEL.md §5), the tokens after that;
(3) the parameters with the best validation loss are written to --out in the Hugging Face layout.
Reproducible from --seed: the step count is fixed by --steps, or derived once from the measured step time when
only --minutes is given (the log prints it; pass it back as --steps to repeat a run exactly on the same device)."""
import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F

from tools.demo import corpus, export
from layers.config import ModelConfig
from layers.model import Qwen35Model

MTP_WEIGHTS = (0.4, 0.3, 0.2)          # loss weight of MTP chain step 1, 2, 3 (drafts 1, 2, 3 of a round)
OUTPUT_PROJECTIONS = ("o_proj.weight", "out_proj.weight", "down_proj.weight")


def init_weights(model: Qwen35Model, seed: int):
    """GPT-style init: N(0, 0.02) matrices and embeddings, residual outputs scaled by 1/sqrt(2·layers);
    (1+w) norms at 0, GDN decay A ~ U(1, 16) and time step dt ~ logU(1e-3, 1e-1) as in Mamba-2 / HF."""
    g = torch.Generator().manual_seed(seed)
    depth = model.cfg.num_hidden_layers + 1
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(1, 16, generator=g).log())
            elif name.endswith("dt_bias"):
                dt = torch.exp(torch.empty(p.shape).uniform_(math.log(1e-3), math.log(1e-1), generator=g))
                p.copy_(dt + torch.log(-torch.expm1(-dt)))           # softplus⁻¹(dt)
            elif name.endswith("linear_attn.norm.weight"):
                p.fill_(1.0)
            elif p.ndim == 1:
                p.zero_()
            elif "conv1d" in name:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
            else:
                std = 0.02 / math.sqrt(2 * depth) if name.endswith(OUTPUT_PROJECTIONS) else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)


def losses(model: Qwen35Model, windows):
    """windows [B, T + 1 + len(MTP_WEIGHTS)] -> (main loss, [MTP step losses]); all rows predict from T positions."""
    depth = len(MTP_WEIGHTS)
    T = windows.shape[1] - 1 - depth
    V = model.cfg.vocab_size

    def ce(hidden, shift):
        return F.cross_entropy(model.logits(hidden).reshape(-1, V), windows[:, shift:T + shift].reshape(-1))

    h = model(windows[:, :T])
    main, mtp, prev = ce(h, 1), [], h
    for j in range(1, depth + 1):
        prev = model.mtp_forward(windows[:, j:T + j], prev)          # step j: embed(x_{i+j}), hidden of step j−1
        mtp.append(ce(prev, j + 1))
    return main, mtp


def sample_windows(stream, batch, length, gen, device):
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=gen)
    return torch.stack([stream[s:s + length] for s in starts.tolist()]).to(device)


@torch.no_grad()
def validate(model, windows):
    model.eval()
    main, mtp = [], []
    for w in windows:
        m, t = losses(model, w)
        main.append(m.item())
        mtp.append([x.item() for x in t])
    model.train()
    return sum(main) / len(main), [sum(col) / len(col) for col in zip(*mtp)]


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--minutes", type=float, default=50.0, help="training time budget (ignored with --steps)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None, help="default: 64 on cuda, 16 on cpu")
    ap.add_argument("--seq", type=int, default=None, help="default: 512 on cuda, 256 on cpu")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--work", default=".cache/demo", help="tokenizer + token streams (prepared when missing)")
    ap.add_argument("--out", default="models/demo")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    batch = args.batch or (64 if cuda else 16)
    seq = args.seq or (512 if cuda else 256)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True                  # fp32 weights, TF32 matmuls: no autocast
        torch.backends.cudnn.allow_tf32 = True                        # (the GDN maths stays in fp32 throughout)
    else:
        torch.set_num_threads(os.cpu_count() or 1)

    t_begin = time.perf_counter()
    if not os.path.exists(os.path.join(args.work, "tokens.safetensors")):
        print(f"preparing tokenizer and corpus in {args.work} ...", flush=True)
        corpus.prepare(args.work, args.vocab)
    tokens = corpus.load_tokens(args.work)
    tokenizer_path = os.path.join(args.work, "tokenizer.json")
    cfg = ModelConfig.from_dict(export.model_config_for(tokenizer_path))

    torch.manual_seed(args.seed)
    model = Qwen35Model(cfg)
    init_weights(model, args.seed)
    model.to(args.device).train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params / 1e6:.2f} M; train/val/test tokens "
          f"{', '.join(f'{tokens[s].numel() / 1e6:.2f} M' for s in corpus.SPLITS)}; batch {batch} x {seq}", flush=True)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "conv1d" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "conv1d" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=cuda)
    length = seq + 1 + len(MTP_WEIGHTS)
    data_gen = torch.Generator().manual_seed(args.seed + 1)
    val_gen = torch.Generator().manual_seed(12345)
    val_windows = [sample_windows(tokens["val"], batch, length, val_gen, args.device) for _ in range(4)]

    total = args.steps
    budget = args.minutes * 60 - (time.perf_counter() - t_begin) - 15   # leave time for the export
    best, best_state, log = float("inf"), None, []
    t_train = time.perf_counter()
    step = 0
    while total is None or step < total:
        warmup = args.warmup if total is None else min(args.warmup, max(1, total // 10))   # short CPU runs
        lr = lr_at(step, total or 10 ** 9, args.lr, warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        main_loss, mtp_losses = losses(model, sample_windows(tokens["train"], batch, length, data_gen, args.device))
        loss = main_loss + sum(w * m for w, m in zip(MTP_WEIGHTS, mtp_losses))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if total is None and step == 20:                               # fix the schedule from the measured speed
            if cuda:
                torch.cuda.synchronize()
            per_step = (time.perf_counter() - t_train) / step
            total = max(step + 1, int(budget / (per_step * 1.06)))        # ~6 % for validation passes
            print(f"{per_step * 1e3:.0f} ms/step -> --steps {total}", flush=True)
        if step % args.eval_every == 0 or step == total:
            val_main, val_mtp = validate(model, val_windows)
            score = val_main + sum(w * m for w, m in zip(MTP_WEIGHTS, val_mtp))
            entry = {"step": step, "seconds": round(time.perf_counter() - t_train, 1), "lr": lr,
                     "train_loss": round(main_loss.item(), 4), "val_loss": round(val_main, 4),
                     "val_mtp_losses": [round(m, 4) for m in val_mtp]}
            log.append(entry)
            print(json.dumps(entry), flush=True)
            if score < best:
                best = score
                best_state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    model.load_state_dict(best_state)
    os.makedirs(args.out, exist_ok=True)
    files = export.write_weights(model, args.out)
    summary = {"seed": args.seed, "device": args.device, "steps": total, "batch": batch, "seq": seq, "lr": args.lr,
               "warmup": args.warmup, "mtp_weights": MTP_WEIGHTS, "params": n_params,
               "tokens_seen": total * batch * seq, "train_seconds": round(time.perf_counter() - t_train, 1),
               "best_val": min(log, key=lambda e: e["val_loss"] + sum(
                   w * m for w, m in zip(MTP_WEIGHTS, e["val_mtp_losses"]))), "log": log}
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(summary, f, indent=1)
    export.write_assets(args.out, tokenizer_path)
    print(f"wrote {', '.join(files)} to {args.out}; {summary['tokens_seen'] / 1e6:.1f} M tokens seen", flush=True)


if __name__ == "__main__":
    main()
