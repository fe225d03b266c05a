"""DFlash training (the head: peagle/drafters/dflash/).

    plan.py   anchors, blocks, their attention mask and loss weights
    step.py   the head's layers over a plan's blocks, the decayed KL loss, held-out evaluation
    kind.py   DFlashOptions and DFlashTraining: what the generic trainer calls
"""
