"""The demo model's offline corpus and its byte-level BPE tokenizer.

Corpus: every CPython standard-library `.py` file of the running interpreter (sysconfig stdlib path, site-packages
excluded) plus the pydoc_data help topics (one document each). Documents are sorted by name and split by
sorted index: index % 20 == 0 -> test (held out: perplexity and acceptance prompts), index % 20 == 10 -> validation
(checkpoint selection), the rest -> train. The split is deterministic for a pinned Python (3.11.7 here); the
prepared token arrays are saved so a GPU machine with another Python trains on exactly the same data.

Tokenizer: Qwen's pre-tokenizer (MODEL.md §6: NFC, regex split with one digit per token, byte-level, no BOS),
BPE trained on the train split only, the five Qwen specials first (ids 0..4)."""
import glob
import os
import sysconfig

import torch
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = ("train", "val", "test")


def split_of(index: int) -> str:
    return "test" if index % 20 == 0 else "val" if index % 20 == 10 else "train"


def documents() -> list[tuple[str, str]]:
    """(name, text) for every corpus document, sorted by name."""
    import pydoc_data.topics
    root = sysconfig.get_paths()["stdlib"]
    docs = []
    for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
        rel = os.path.relpath(path, root)
        if "site-packages" in rel.split(os.sep):
            continue
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        if text.strip():
            docs.append((rel, text))
    docs += [(f"pydoc_data/topics/{name}", text) for name, text in pydoc_data.topics.topics.items()]
    return sorted(docs)


def split_documents() -> dict[str, list[tuple[str, str]]]:
    out = {s: [] for s in SPLITS}
    for i, doc in enumerate(documents()):
        out[split_of(i)].append(doc)
    return out


def train_tokenizer(texts, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[AddedToken(s, special=True, normalized=False)
                                                                         for s in SPECIALS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    for i, s in enumerate(SPECIALS):                 # the trainer puts the specials first, in order
        assert tok.token_to_id(s) == i, s
    return tok


def encode_split(tok: Tokenizer, docs) -> torch.Tensor:
    """All documents of a split, each followed by <|endoftext|>, as one int16 stream (vocab < 32768)."""
    eot = tok.token_to_id("<|endoftext|>")
    ids = []
    for enc in tok.encode_batch([text for _, text in docs]):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.int16)


def prepare(work_dir: str, vocab_size: int) -> None:
    """Write work_dir/tokenizer.json and work_dir/tokens.safetensors ({train, val, test} int16 streams)."""
    os.makedirs(work_dir, exist_ok=True)
    parts = split_documents()
    tok = train_tokenizer((text for _, text in parts["train"]), vocab_size)
    tok.save(os.path.join(work_dir, "tokenizer.json"))
    save_file({s: encode_split(tok, parts[s]) for s in SPLITS}, os.path.join(work_dir, "tokens.safetensors"),
              metadata={"documents": str({s: len(parts[s]) for s in SPLITS})})


def load_tokens(work_dir: str) -> dict[str, torch.Tensor]:
    """{split: int64 token stream}."""
    return {s: t.long() for s, t in load_file(os.path.join(work_dir, "tokens.safetensors")).items()}
