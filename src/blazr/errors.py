"""User-facing errors: one line that names the file/tensor/field, what was expected and what was found.

Raised at the edges (detection, loading, tokenizer selection, request validation) and printed by the CLI
without a traceback; internal invariants use `assert` instead.
"""


class BlazrError(Exception):
    """A problem with the user's input (checkpoint, flags, request) — never a bug in blazr."""


class CheckpointError(BlazrError):
    """A checkpoint that is missing, corrupt, or does not match its config."""


class UnsupportedError(BlazrError):
    """Something well-formed that blazr does not support (an architecture, a tensor type)."""
