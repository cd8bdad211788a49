"""A tokenizer for the tiny CPU model, written on demand (no hub): what a
server needs to judge stop strings (the ``pp1-text`` topology; the CPU
default skips the tokenizer, and SGLang then refuses every ``stop``).

512 ids, the tiny model's vocabulary: ``<UNK>``, ``<BOS>``, ``<EOS>`` (ids
0-2, special; the model's bos 1 and eos 2), the letters ``a``-``h`` (3-10),
the 64 two-letter strings over them (11-74) and the first 437 three-letter
ones (75-511). A BPE model whose merges make every two- and three-letter
token, so ``encode`` compresses ("abc" is one id) while the model may emit
the same text as one, two or three ids; decoding concatenates (the ``Fuse``
decoder, no spaces). So a stop string's occurrence in an output can span
more ids than its own encoding: SGLang looks for stop strings in the text of
the last ``len(encode(stop)) + 1`` output ids only, and the harness can draw
stops that it must see and stops that it misses by design
(``scheduler_side/stop_strings.py``).

The folder holds ``tokenizer.json``, ``tokenizer_config.json`` (class
``PreTrainedTokenizerFast``) and ``special_tokens_map.json`` and no
``config.json``: beside the Qwen2 config, transformers would build a
``Qwen2Tokenizer`` (a byte-level decoder and a 513th token) instead.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Dict, List, Tuple

from scripted_runtime.user_side.models.files import models_root, write_if_changed

ALPHABET = "abcdefgh"
SPECIALS = ("<UNK>", "<BOS>", "<EOS>")
VOCAB_SIZE = 512
NAME = "tiny-tokenizer-v1"  # the folder's name: a change to the construction changes it


def vocab_and_merges() -> Tuple[Dict[str, int], List[Tuple[str, str]]]:
    """The BPE vocabulary (token -> id, ``VOCAB_SIZE`` of them) and merges. Pure."""
    tokens = list(SPECIALS) + list(ALPHABET)
    pairs = ["".join(p) for p in itertools.product(ALPHABET, repeat=2)]
    triples = ["".join(p) for p in itertools.product(ALPHABET, repeat=3)]
    tokens += pairs
    tokens += triples[:VOCAB_SIZE - len(tokens)]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [(p[0], p[1]) for p in pairs] + [(t[:2], t[2]) for t in tokens[len(SPECIALS) + len(ALPHABET)
                                                                             + len(pairs):]]
    return vocab, merges


def _files() -> Dict[str, str]:
    from tokenizers import AddedToken, Tokenizer, decoders, models

    vocab, merges = vocab_and_merges()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=SPECIALS[0]))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    specials = {"unk_token": SPECIALS[0], "bos_token": SPECIALS[1], "eos_token": SPECIALS[2]}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **specials, "add_bos_token": False,
              "add_eos_token": False, "clean_up_tokenization_spaces": False, "model_max_length": 4096}
    return {"tokenizer.json": tok.to_str(), "tokenizer_config.json": json.dumps(config, indent=2),
            "special_tokens_map.json": json.dumps(specials, indent=2)}


def tokenizer_dir() -> Path:
    """The tokenizer's folder under the models root (written once; a
    partial or older copy is rewritten)."""
    folder = models_root() / NAME
    for name, text in _files().items():
        write_if_changed(folder, name, text)
    return folder
