"""The input seed of every timed call: derived by the trusted parent, reproduced by the reference.

Kept free of torch so that the parent, which only derives seeds for the audit, never imports it.
"""


def call_seed(seed: int, call: int) -> int:
    """The noise seed of timed call ``call`` in a loop seeded with ``seed`` (shared with the reference)."""
    return (seed + call * 1_000_003) % 2**63
