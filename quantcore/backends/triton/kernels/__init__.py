"""`@triton.jit` code of the Triton backend, one short module per concern.

Nothing here is imported by `quantcore` itself: `launch.py` imports these modules (and Triton) on
first use of a Triton implementation.
"""
