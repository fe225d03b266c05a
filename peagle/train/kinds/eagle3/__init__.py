"""EAGLE-3 training (the head: peagle/drafters/eagle3.py).

    plan.py   training-time test: one dense group per unrolled depth
    step.py   the depths unrolled in sequence, each reading the previous depth's outputs
    kind.py   Eagle3Options and Eagle3Training: what the generic trainer calls
"""
