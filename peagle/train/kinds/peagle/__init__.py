"""P-EAGLE training (the head: peagle/drafters/peagle.py).

    plan.py        COD chains (the mask-depth elements a step supervises), sequence partitioning
    step.py        the loss over a plan, one forward+backward per segment; its weights per depth
    kind.py        PEagleOptions and PEagleTraining: what the generic trainer calls
    warm_start.py  a P-EAGLE head that begins as a trained EAGLE-3 head (--init-from)
"""
