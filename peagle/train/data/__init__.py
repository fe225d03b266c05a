"""The training data: prompts, the target's own answers to them, and what training reads of them.

    prompts.py, sources.py  the prompts: ShareGPT turns, standard-library code, broader kinds
                            (writing, math, code tasks, long turns); corpora.py reads their raw material
    magpie.py               prompts the target writes itself
    regeneration.py         `peagle train data`: the target answers every prompt, shard by shard, resumable
    engine.py, engine_vllm.py   the engines that decode the answers (continuous batching; vLLM)
    shards.py               a shard on disk (compact rows.npz + peagle_meta.json)
    rows.py                 which rows a run trains on, which ones earlier runs drew
    vocab.py                `peagle train vocab`: the draft vocabulary (the most frequent answer tokens)
    features.py             `peagle train features`: the target's features of every row, cached
"""
from .regeneration import GenerationSettings, regenerate

__all__ = ["GenerationSettings", "regenerate"]
