"""Progress bars on the terminal for work that can take more than a couple of seconds: a model's load (and
the in-situ quantization inside it), the first compile of the C kernels, the quantization cache's write,
a download.

One policy for all of them (`enabled`): a bar shows only when stderr is a terminal and the user did not
ask for quiet — `--log-level warning` (or `error`) given explicitly, or `BLAZR_LOG` set so — and only once
the work has taken `DELAY_S` (tqdm's `delay`: quick work prints nothing). A bar clears itself when done
(`leave=False`), so what stays on the terminal is what the command prints. The CLI sets the user's choice
once (`configure`); library users get bars on a terminal, none elsewhere.

`BLAZR_PROGRESS_DELAY` overrides the delay (seconds; tests set 0 to see every bar).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from tqdm import tqdm

DELAY_S = 2.0
QUIET_LEVELS = ("warning", "error", "critical")

_quiet = False  # the user asked for quiet (configure); process-wide, like the logging level it follows


def configure(log_level: str | None, explicit: bool) -> None:
    """The command line's word: quiet when the user set `log_level` to warning or quieter explicitly (the
    default level, warning, leaves bars on)."""
    global _quiet
    _quiet = explicit and str(log_level).lower() in QUIET_LEVELS


def enabled() -> bool:
    """Whether a bar may show: stderr is a terminal and the user did not ask for quiet."""
    try:
        return not _quiet and sys.stderr.isatty()
    except (AttributeError, ValueError):  # stderr replaced or closed
        return False


def delay() -> float:
    """Seconds of work before a bar appears."""
    try:
        return max(0.0, float(os.environ.get("BLAZR_PROGRESS_DELAY", DELAY_S)))
    except ValueError:
        return DELAY_S


def bar(total: float | None, desc: str, unit: str = "it", *, show: bool | None = None, **kwargs: Any) -> tqdm:
    """A tqdm bar on stderr under the policy above (`show` True / False overrides it; None: `enabled()`).
    `unit="B"` counts bytes (scaled to kB / MB / GB)."""
    on = enabled() if show is None else show
    if unit == "B":
        kwargs.setdefault("unit_scale", True)
        kwargs.setdefault("unit_divisor", 1024)
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        delay=delay(),
        leave=False,
        disable=not on,
        **kwargs,
    )
