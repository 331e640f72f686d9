"""A tiny BERT WordPiece model in the packaged MiniLM's file layout (random weights, a 40-token vocabulary:
made in milliseconds), for tests of the static text encoder and of what reads its vectors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "i", "you", "sad", "sorry", "dog", "died",
         "happy", "glad", "market", "stock", "rose", "today", "feel", "so", "my", "is", "that", "hard", "how",
         "are", "good", "bad", "day", "##s", "##ing", "##ed", "news", "hear", "to", "about", "your", "and", "."]


def tiny_model(folder: Path, seed: int = 0) -> Path:
    """A 1-layer BERT (hidden 8, 2 heads) with a WordPiece tokenizer, in the packaged model's file layout."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    hidden, inner, n = 8, 16, len(VOCAB)

    def r(*shape):
        return rng.normal(0, 0.5, shape).astype(np.float32)

    weights = {"embeddings.word_embeddings.weight": r(n, hidden), "embeddings.position_embeddings.weight": r(16, hidden),
               "embeddings.token_type_embeddings.weight": r(2, hidden),
               "embeddings.LayerNorm.weight": np.ones(hidden, np.float32),
               "embeddings.LayerNorm.bias": np.zeros(hidden, np.float32)}
    p = "encoder.layer.0."
    for name, shape in (("attention.self.query", (hidden, hidden)), ("attention.self.key", (hidden, hidden)),
                        ("attention.self.value", (hidden, hidden)), ("attention.output.dense", (hidden, hidden)),
                        ("intermediate.dense", (inner, hidden)), ("output.dense", (hidden, inner))):
        weights[p + name + ".weight"], weights[p + name + ".bias"] = r(*shape), r(shape[0])
    for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
        weights[p + norm + ".weight"], weights[p + norm + ".bias"] = np.ones(hidden, np.float32), np.zeros(hidden, np.float32)
    save_file(weights, str(folder / "model.safetensors"))
    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps({"hidden_size": hidden, "num_attention_heads": 2,
                                                    "num_hidden_layers": 1, "layer_norm_eps": 1e-12}))
    return folder


from sense7.model import static_embeddings  # noqa: E402
from sense7.model.static_embeddings import StaticEmbeddingEncoder  # noqa: E402


class CountingEncoder(StaticEmbeddingEncoder):
    """The static encoder, keeping every text it embeds (in a list shared by its clones): a real encoder whose
    calls a test can count."""

    embedded: list = []

    def transform(self, texts):
        texts = list(texts)
        CountingEncoder.embedded.extend(texts)
        return super().transform(texts)


def counting_encoders(folder: Path):
    """A maker of CountingEncoders over tiny models in `folder` (make(seed, dimensions)); the process's tables and
    the count start empty."""
    static_embeddings._tables.clear()
    CountingEncoder.embedded.clear()
    models_made = {}

    def make(seed: int = 0, dimensions: int = 4) -> CountingEncoder:
        if seed not in models_made:
            models_made[seed] = tiny_model(folder / f"model-{seed}", seed=seed)
        return CountingEncoder(model_path=str(models_made[seed]), cache_dir=str(folder / "tables"),
                               dimensions=dimensions)
    return make
