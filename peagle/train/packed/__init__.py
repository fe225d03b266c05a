"""The packed stream every kind's training step runs over.

    stream.py      the sequences of a micro-batch packed into one stream; the elements (anchor, depth)
                   P-EAGLE's and EAGLE-3's plans are made of
    attention.py   attention over a packed stream, in query chunks, without an [E, E] mask (the CPU path)
    flex.py        the same attention in one FlexAttention call per layer and pass (the GPU path)
    forward.py     a head's passes over the stream, the KL loss against the target, step statistics
"""
