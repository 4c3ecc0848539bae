"""The text the embedded model pair is trained on: the running interpreter's standard library.

Every machine that runs the workbook has it, offline, and it is real text with long-range
structure (code plus docstrings) -- enough for a 12-layer model to learn something a draft
can then imitate. The split is by file, decided by a hash of the relative path, so
held-out prompts come from files the target never saw.
"""
from __future__ import annotations

import hashlib
import json
import platform
import random
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

SKIP_PARTS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclass
class Corpus:
    root: str
    train_files: list[str]
    heldout_files: list[str]
    train_text: str = field(repr=False)
    heldout_text: str = field(repr=False)

    def record(self) -> dict:
        """What exactly was used, so a rebuild elsewhere can say why it differs."""
        digest = hashlib.sha256()
        for name in self.train_files:
            digest.update(name.encode())
        return {
            "source": "Python standard library source of the building interpreter",
            "python": platform.python_version(),
            "root": self.root,
            "train_files": len(self.train_files),
            "heldout_files": len(self.heldout_files),
            "train_chars": len(self.train_text),
            "heldout_chars": len(self.heldout_text),
            "train_file_list_sha256": digest.hexdigest(),
            "heldout_file_list": self.heldout_files,
        }


def _bucket(rel: str) -> int:
    return int(hashlib.sha1(rel.encode()).hexdigest()[:8], 16)


def stdlib_corpus(max_chars: int = 12_000_000, heldout_every: int = 16, root: str | None = None) -> Corpus:
    """Files in a fixed hash order; every ``heldout_every``-th bucket is held out."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise FileNotFoundError(f"standard library source not found at {base}")
    files = [f for f in base.rglob("*.py") if not (SKIP_PARTS & set(f.relative_to(base).parts))]
    rels = sorted((f.relative_to(base).as_posix() for f in files), key=lambda r: (_bucket(r), r))
    train, held, train_parts, held_parts = [], [], [], []
    n_train = n_held = 0
    for rel in rels:
        try:
            text = (base / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if _bucket(rel) % heldout_every == 0:
            if n_held < max_chars // 8:
                held.append(rel)
                held_parts.append(text)
                n_held += len(text)
        elif n_train < max_chars:
            train.append(rel)
            train_parts.append(text)
            n_train += len(text)
    if not train or not held:
        raise RuntimeError(f"too little text under {base} to build a corpus")
    sep = "\n\n"
    return Corpus(str(base), train, held, sep.join(train_parts), sep.join(held_parts))


# the tokenizer styles build-default can train: "byte-level" (GPT-2's byte alphabet; the DeepSeek pair) and
# "llama" (Llama-2's: a "▁" word marker and byte-fallback tokens <0x00>..<0xFF>), the one llama.cpp's own
# converter accepts without knowing the pre-tokenizer's hash (docs/llamacpp.md)
TOKENIZER_STYLES = ("byte-level", "llama")
LLAMA_SPECIALS = ("<unk>", "<s>", "</s>")


def train_tokenizer(text: str, vocab_size: int = 4096, style: str = "byte-level") -> Tokenizer:
    """A BPE trained on ``text``. ``byte-level``: no unknown tokens, whitespace-heavy code compresses well.
    ``llama``: ``<unk> <s> </s>``, then the 256 byte tokens, then the merges; words carry a leading "▁"."""
    chunk = 1 << 16
    pieces = (text[i:i + chunk] for i in range(0, len(text), chunk))
    if style == "byte-level":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<|bos|>", "<|eos|>", "<|pad|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(pieces, trainer=trainer)
        return tok
    if style != "llama":
        raise ValueError(f"unknown tokenizer style {style!r}; expected one of {', '.join(TOKENIZER_STYLES)}")
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    # a run of markers stays one piece with the word it precedes: code's indentation compresses
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False),
        pre_tokenizers.Split(Regex("\u2581+[^\u2581\n]*|[^\u2581\n]+|\n+"), behavior="isolated")])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(byte_tokens),
                                  special_tokens=list(LLAMA_SPECIALS), limit_alphabet=160,
                                  show_progress=False)
    tok.train_from_iterator(pieces, trainer=trainer)
    # byte tokens are ordinary vocabulary entries (ids 3..258), as in Llama-2's own vocabulary, so that a
    # decode never drops them as "special"
    spec = json.loads(tok.to_str())
    learned = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {t: i for i, t in enumerate(LLAMA_SPECIALS)}
    for t in byte_tokens:
        vocab[t] = len(vocab)
    for t, _ in learned:
        if t not in vocab:
            vocab[t] = len(vocab)
    spec["model"]["vocab"] = vocab
    spec["added_tokens"] = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True} for t in LLAMA_SPECIALS]
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    return Tokenizer.from_str(json.dumps(spec))


def special_ids(tok: Tokenizer) -> dict:
    """The config's ``bos/eos/pad_token_id`` for a tokenizer ``train_tokenizer`` made."""
    if tok.token_to_id("<s>") is not None:
        return {"bos_token_id": tok.token_to_id("<s>"), "eos_token_id": tok.token_to_id("</s>"),
                "pad_token_id": tok.token_to_id("<unk>")}
    return {"bos_token_id": tok.token_to_id("<|bos|>"), "eos_token_id": tok.token_to_id("<|eos|>"),
            "pad_token_id": tok.token_to_id("<|pad|>")}


def save_hf_tokenizer(tok: Tokenizer, out_dir: Path, max_len: int = 2048) -> None:
    """Write the files ``AutoTokenizer.from_pretrained`` expects (the special tokens by the tokenizer's
    style)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    if tok.token_to_id("<s>") is not None:
        names = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    else:
        names = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", **names,
        "model_max_length": max_len, "clean_up_tokenization_spaces": False,
    }, indent=2), encoding="utf-8")


def prompt_chunks(text: str, tok: Tokenizer, n: int, prompt_tokens: int = 48, seed: int = 0) -> list[str]:
    """Prompts that start at a ``def``/``class`` line of held-out text: code a model continues."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, l in enumerate(lines) if l.lstrip().startswith(("def ", "class ")) and len(l) > 12]
    rng = random.Random(seed)
    rng.shuffle(starts)
    out: list[str] = []
    for i in starts:
        piece = "".join(lines[i:i + 12])
        ids = tok.encode(piece).ids
        if len(ids) < prompt_tokens:
            continue
        prompt = tok.decode(ids[:prompt_tokens])
        if prompt not in out:
            out.append(prompt)
        if len(out) == n:
            break
    return out
