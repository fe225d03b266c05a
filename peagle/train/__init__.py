"""Training draft heads, in the order the pipeline runs (``peagle train ...``, cli.py):

    data/      1. the data: prompts, the target's own answers to them (``peagle train data``), the
                  draft vocabulary (``vocab``) and the target's features of every row (``features``)
    packed/    2. the packed stream a training step runs over: its elements, attention, passes, loss
    kinds/     3. what each kind of head trains: the interface the loop calls (base.py), the
                  registry (one line per kind) and a folder per kind: peagle/, eagle3/, dflash/
    trainer/   4. the generic loop (``peagle train NAME``): set-up, resume, steps, checkpoints;
                  the evaluation of trained heads (``peagle train evaluate``)
    tiny.py    tiny random targets, heads and data, for tests and quick experiments
"""
