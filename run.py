"""Command line: one-shot generation (`--prompt`, repeatable; `--json` for machine-readable output), an
interactive chat (`--interactive`) or an OpenAI Batch JSONL file (`--batch-file IN --output OUT`).

On a CUDA machine the graph engine runs (engine/graph_engine.py: CUDA graphs, continuous batching; several
`--prompt`s run as one batch, printed in order); `--eager`, or `--device cpu`, runs the plain-torch engine
(engine/engine.py), where `--dtype` and `--threads` apply.

Sampling flags default to the model's generation_config. User errors (missing model, unreadable batch file, bad
flag) print one line naming what is wrong and exit with status 2, without a traceback. A batch in which a request
failed runs to the end and exits with status 1, its last stderr line saying how many failed and where their error
records are."""
import argparse
import io
import json
import math
import re
import sys

from layers.config import MAX_SPEC_K

EXIT_REQUESTS_FAILED = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="checkpoint directory (default: the demo model)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when there is one, else cpu)")
    p.add_argument("--eager", action="store_true", help="on cuda: the plain-torch engine instead of the graph engine")
    p.add_argument("--dtype", help="eager engine: weight/activation dtype (default float32)")
    p.add_argument("--threads", type=int, help="eager engine: CPU threads (default: 1 for models under 100M "
                   "parameters unless OMP_NUM_THREADS is set, else torch's default)")
    p.add_argument("--profile", metavar="NAME", help="graph engine: hardware profile, profiles/NAME.json (default: "
                   "rtx3090 on a GPU named so, else h200)")
    p.add_argument("--max-seqs", type=int, help="graph engine: sequences decoded together at most (default: the "
                   "number of --prompts, 1 for --interactive, the profile's largest batch bucket for a batch file)")
    p.add_argument("--max-len", type=int, help="graph engine: context tokens per sequence (default: what the "
                   "memory plan fits for --max-seqs)")
    p.add_argument("--body", choices=("int4", "bf16"), help="graph engine: body linears of a checkpoint prepared "
                   "at load (default int4; a prepared directory keeps its own)")
    p.add_argument("--profile-steps", type=int, metavar="N", help="graph engine: after 8 warm-up decode steps, "
                   "bracket N with cudaProfilerStart/Stop, NVTX ranges around each step and prefill chunk (nsys "
                   "profile -c cudaProfilerApi --capture-range-end=stop)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--prompt", action="append", help="prompt text; repeat for several prompts")
    mode.add_argument("--interactive", action="store_true", help="multi-turn chat on the terminal")
    mode.add_argument("--batch-file", metavar="IN.jsonl", help="OpenAI Batch JSONL input (needs --output)")
    p.add_argument("--output", metavar="OUT.jsonl", help="batch results, appended (a rerun skips the requests with a "
                   "result and runs the failed ones again)")
    p.add_argument("--batch-errors", metavar="FILE", help="write failed batch requests here instead of --output")
    p.add_argument("--batch-summary-json", metavar="FILE", help="write the batch summary as JSON")
    p.add_argument("--max-new-tokens", type=int, default=512, help="tokens to generate at most (default 512; "
                   "in a batch, for requests without max_tokens)")
    p.add_argument("--temperature", type=float, help="0 = greedy (default: generation_config)")
    p.add_argument("--top-k", type=int, help="0 = off (default: generation_config)")
    p.add_argument("--top-p", type=float, help="(default: generation_config)")
    p.add_argument("--seed", type=int, help="makes sampling reproducible")
    p.add_argument("--spec-k", type=int, help="MTP draft tokens per step; 0 turns drafting off (default: the "
                   "profile's on the graph engine, 4 on the eager one)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at end tokens: generate exactly N")
    p.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
    p.add_argument("--system", help="system message for chat prompts")
    p.add_argument("--no-think", action="store_true", help="chat template with thinking off")
    p.add_argument("--json", action="store_true", help="one JSON object per prompt on stdout")
    return p


def _check_args(p: argparse.ArgumentParser, args):
    if not (args.prompt or args.interactive or args.batch_file):
        p.error("give --prompt TEXT, --interactive or --batch-file IN.jsonl")
    if args.batch_file and not args.output:
        p.error("--batch-file needs --output OUT.jsonl")
    # flags that the chosen mode would ignore: say so rather than run without them
    ignored = ([f for f, v in (("--output", args.output), ("--batch-errors", args.batch_errors),
                               ("--batch-summary-json", args.batch_summary_json)) if v] if not args.batch_file else
               [f for f, v in (("--json", args.json), ("--raw", args.raw), ("--system", args.system),
                               ("--no-think", args.no_think)) if v])
    if ignored:
        p.error(f"{', '.join(ignored)} cannot be used {'without' if not args.batch_file else 'with'} --batch-file")
    if args.model == "":
        p.error("--model must name a checkpoint directory")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        p.error(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    path_flags = {"graph": [("--profile", args.profile), ("--max-seqs", args.max_seqs), ("--max-len", args.max_len),
                            ("--body", args.body), ("--profile-steps", args.profile_steps)],
                  "eager": [("--dtype", args.dtype), ("--threads", args.threads)]}
    wrong = [f for f, v in path_flags["eager" if _graph(args) else "graph"] if v is not None]
    if wrong:
        where = ("the graph engine (on cuda; give --eager for the plain-torch engine)" if _graph(args) else
                 "the plain-torch engine (--eager or --device cpu): they are graph engine flags")
        p.error(f"{', '.join(wrong)} cannot be used with {where}")
    for flag, value in (("--max-seqs", args.max_seqs), ("--max-len", args.max_len), ("--profile-steps",
                                                                                     args.profile_steps)):
        if value is not None and value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    if args.max_new_tokens < 1:
        p.error(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.spec_k is not None and not 0 <= args.spec_k <= MAX_SPEC_K:
        p.error(f"--spec-k must be in [0, {MAX_SPEC_K}], got {args.spec_k}")
    if args.temperature is not None and not (math.isfinite(args.temperature) and args.temperature >= 0):
        p.error(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.top_k is not None and not 0 <= args.top_k < 2**31:
        p.error(f"--top-k must be in [0, 2^31), got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        p.error(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.seed is not None:
        from engine.sampling import SEED_RANGE, seed_in_range
        if not seed_in_range(args.seed):
            p.error(f"--seed must be in {SEED_RANGE}, got {args.seed}")
    from engine.tokenizer import is_utf8
    for flag, texts in (("--prompt", args.prompt or []), ("--system", [args.system] if args.system else [])):
        for text in texts:
            if flag == "--prompt" and not text:
                p.error("--prompt must not be empty")
            if not is_utf8(text):
                p.error(f"{flag} is not valid UTF-8")


def _default_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _graph(args) -> bool:
    """The graph engine runs: on cuda unless --eager."""
    return args.device.startswith("cuda") and not args.eager


def _max_seqs(args) -> int | None:
    """--max-seqs, else what the mode decodes at once: a batch file the profile's largest bucket (None), the REPL
    one conversation, --prompt its prompts. Fewer slots capture fewer graphs at start-up and leave each slot more
    context."""
    if args.max_seqs is not None or args.batch_file:
        return args.max_seqs
    if args.interactive:
        return 1
    from engine.graph_engine import device_profile
    return min(len(args.prompt), max(device_profile(args.profile, args.device)["batch_buckets"]))


def _load(args):
    if not _graph(args):
        from engine.engine import Engine
        return Engine.load(args.model, device=args.device, dtype=args.dtype or "float32",
                           spec_k=4 if args.spec_k is None else args.spec_k, threads=args.threads)
    from engine.graph_engine import GraphEngine, profiler_runtime
    if args.profile_steps:
        profiler_runtime()                     # missing cuda-python said before the model loads
    engine = GraphEngine.load(args.model, device=args.device, profile=args.profile, spec_k=args.spec_k,
                              max_seqs=_max_seqs(args), max_len=args.max_len, body=args.body or "int4")
    t = engine.timings
    print(f"[ graph engine: profile {engine.profile['name']}, {engine.max_seqs} sequences x {engine.max_len} tokens, "
          f"spec_k {engine.spec_k}; loaded in {t['load_s']:.1f} s, graphs captured in {t['capture_s']:.1f} s ]",
          file=sys.stderr, flush=True)
    if args.profile_steps:
        engine.profile_steps(args.profile_steps)
    return engine


def _sampling(args, defaults):
    from engine.sampling import SamplingParams
    pick = lambda flag, default: default if flag is None else flag  # noqa: E731
    return SamplingParams(temperature=pick(args.temperature, defaults.temperature),
                          top_k=pick(args.top_k, defaults.top_k), top_p=pick(args.top_p, defaults.top_p),
                          seed=args.seed)


def _prompt_ids(engine, args, prompt: str) -> list[int]:
    from engine.repl import chat_prompt_ids
    if args.raw:
        return engine.tokenizer.encode(prompt)
    system_turn = [{"role": "system", "content": args.system}] if args.system else []
    return chat_prompt_ids(engine.tokenizer, system_turn + [{"role": "user", "content": prompt}], not args.no_think)


def _peak_memory_line(device: str) -> str:
    import torch
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"\nPeak memory: {torch.cuda.max_memory_allocated() / 1e9:.3f} GB"
    return ""


def _print_json(engine, prompt: str, ids: list, result):
    print(json.dumps({"prompt": prompt, "prompt_tokens": len(ids), "token_ids": result.token_ids,
                      "text": engine.tokenizer.decode(result.token_ids), "finish_reason": result.finish_reason,
                      "stats": result.stats.as_dict()}, ensure_ascii=False), flush=True)


def _print_human(args, text: str, result):
    """The mlx-style block: the generated text (already written when streamed: text None) and the speeds."""
    from engine.repl import mtp_summary
    if text is not None:
        print(f"==========\n{text}", end="", flush=True)
    s = result.stats
    print("==========\n"
          f"Prompt: {s.prompt_tokens} tokens, {s.prompt_tokens_per_second:.3f} tokens-per-sec\n"
          f"Generation: {s.generated} tokens, {s.tokens_per_second:.3f} tokens-per-sec"
          + (f"\nMTP accept: {mtp_summary(s)}" if s.drafted else "")
          + (f"\nStep: {s.step_ms:.3f} ms" if s.step_ms is not None else "") + _peak_memory_line(args.device),
          flush=True)


def _one_shot(engine, args, prompt: str, ids: list, sampling):
    from engine.repl import EchoStream
    if args.json:
        _print_json(engine, prompt, ids, engine.generate(ids, args.max_new_tokens, sampling,
                                                         ignore_eos=args.ignore_eos))
        return
    print("==========", flush=True)
    stream = EchoStream(engine.tokenizer, sys.stdout, thinking=not (args.raw or args.no_think))
    result = engine.generate(ids, args.max_new_tokens, sampling, ignore_eos=args.ignore_eos, on_tokens=stream)
    stream.finish()
    stream.end_line()
    _print_human(args, None, result)


def _together(engine, args, prompts: list, sampling):
    """Several prompts as one continuous batch on the graph engine; each printed in order once all are done."""
    from engine.repl import EchoStream
    texts = [io.StringIO() for _ in prompts]
    streams = [EchoStream(engine.tokenizer, text, thinking=not (args.raw or args.no_think)) for text in texts]
    results = engine.generate_many([dict(prompt_ids=ids, max_new_tokens=args.max_new_tokens, sampling=sampling,
                                         ignore_eos=args.ignore_eos, on_tokens=None if args.json else stream)
                                    for (_, ids), stream in zip(prompts, streams)])
    for (prompt, ids), stream, text, result in zip(prompts, streams, texts, results):
        if args.json:
            _print_json(engine, prompt, ids, result)
            continue
        stream.finish()
        stream.end_line()
        _print_human(args, text.getvalue(), result)


def _user_error(e) -> int:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_USAGE


def _run_batch(engine, args, sampling) -> int:
    from engine.batch import BatchFileError, RequestDefaults, run_batch
    defaults = RequestDefaults(args.max_new_tokens, sampling.temperature, sampling.top_k, sampling.top_p, args.seed,
                               args.ignore_eos)
    try:
        summary = run_batch(engine, args.batch_file, args.output, defaults, errors_path=args.batch_errors,
                            summary_path=args.batch_summary_json)     # failed requests are recorded, not fatal
    except BatchFileError as e:
        return _user_error(e)
    return EXIT_REQUESTS_FAILED if summary.failed else 0


def _run_prompts(engine, args, sampling) -> int:
    limit = engine.max_context
    prompts = []
    for n, prompt in enumerate(args.prompt, 1):        # every prompt checked before the first is answered
        try:
            ids = _prompt_ids(engine, args, prompt)
        except ValueError as e:
            return _user_error(e)
        if len(ids) + args.max_new_tokens > limit:
            return _user_error(f"--prompt {n}: {len(ids)} tokens + --max-new-tokens {args.max_new_tokens} exceed "
                               f"{engine.max_context_name} ({limit})")
        prompts.append((prompt, ids))
    try:
        if len(prompts) > 1 and hasattr(engine, "generate_many"):
            _together(engine, args, prompts, sampling)
        else:
            for prompt, ids in prompts:
                _one_shot(engine, args, prompt, ids, sampling)
    except ValueError as e:                  # the engine refuses the prompt (a token id outside the vocabulary)
        return _user_error(e)
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = _default_device()
    _check_args(parser, args)
    try:
        from engine.repl import run_repl
        try:
            engine = _load(args)
        except (ValueError, OSError) as e:   # FileNotFoundError included: a wrong --model is a user error
            return _user_error(e)
        sampling = _sampling(args, engine.defaults)
        if args.batch_file:
            return _run_batch(engine, args, sampling)
        if args.interactive:
            return run_repl(engine, sampling, max_new_tokens=args.max_new_tokens, enable_thinking=not args.no_think,
                            system=args.system, ignore_eos=args.ignore_eos)
        return _run_prompts(engine, args, sampling)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
