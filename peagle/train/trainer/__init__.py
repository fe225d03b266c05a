"""The generic loop that trains a head of any kind, and the evaluation of trained heads.

    loop.py         train(): set up, resume, then per step plan, forward and backward, step, log, checkpoint
    config.py       TrainConfig: the options every kind shares + the kind's own; saved configs of any version
    batches.py      TrainSet: the run's sequences and their features; micro-batches
    schedule.py     AdamW and the learning-rate schedule (warm-up, cosine, a length fitted to --max-minutes)
    checkpoints.py  a run's checkpoints: write, check, resume; a saved head as the start (--init-from)
    precondition.py fc in standardised input units (--precondition)
    resident.py     resident memory: logged every step, freed heap handed back
    memory.py       `python -m peagle.train.trainer.memory`: peak memory of a P-EAGLE step by segments
    evaluate.py     `peagle train evaluate`: held-out KL, agreement and acceptance of any trained head
    suite.py        the evaluation suite: every head on the same sets, one table
    plot.py         loss curves of runs as one PNG
"""
from .config import TrainConfig
from .loop import train

__all__ = ["TrainConfig", "train"]
