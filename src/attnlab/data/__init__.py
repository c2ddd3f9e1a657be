"""Data: corpora, tokenizers, token shards (memmaps) and fixed batch schedules.

Typical use::

    from attnlab.data import prepare, TokenData, get_schedule, batch_tokens

    prepare("wiki-sample", "bpe-4096", "data/wiki-sample-bpe-4096")
    data = TokenData.open("data/wiki-sample-bpe-4096")
    sched = get_schedule(data.directory, "train", seq_len=256, seqs_per_step=8, n_steps=1000, seed=0)
    x, y = batch_tokens(data.train, sched.offsets[step], seq_len=256)
"""

from attnlab.data.corpus import Corpus, register_corpus
from attnlab.data.corpus_lookup import open_corpus, registered_corpora
from attnlab.data.preparation import default_data_dir, ensure_prepared, prepare
from attnlab.data.schedule import Schedule, batch_tokens, get_schedule
from attnlab.data.shards import token_dtype
from attnlab.data.tokendata import TokenData, read_meta
from attnlab.data.tokenizer import Tokenizer
from attnlab.data.tokenizer_lookup import load_tokenizer

__all__ = [
    "Corpus",
    "Schedule",
    "TokenData",
    "Tokenizer",
    "batch_tokens",
    "default_data_dir",
    "ensure_prepared",
    "get_schedule",
    "load_tokenizer",
    "open_corpus",
    "prepare",
    "read_meta",
    "register_corpus",
    "registered_corpora",
    "token_dtype",
]
