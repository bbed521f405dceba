"""Progress on the terminal (blazr/progress.py): bars for a model's load, the quantization cache's write and
the kernels' first compile show on a terminal, and nowhere else — not when stderr is a pipe or a file, not
under an explicit `--log-level warning`. The command runs in a pseudo-terminal, as a user's shell runs it;
BLAZR_PROGRESS_DELAY=0 shows every bar however quick the tiny model's work is."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from blazr import progress
from blazr.kernels import build as kernel_build
from tests.tiny import build

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-progress")
    build("LlamaForCausalLM", path, seed=3, vocab_size=100288)  # cl100k_base ids fit
    return path


def _generate(tiny: Path, cache: Path, *extra: str, tty: bool) -> tuple[int, str]:
    """`blazr generate` on the tiny model with --quantize int8 (a load that quantizes and writes the cache);
    its stderr on a pseudo-terminal (`tty`) or a pipe → (status, what stderr showed)."""
    cmd = [sys.executable, "-m", "blazr", "generate", "--model", str(tiny), "--cpu", "--quantize", "int8",
           "--prompt", "hi", "--max-tokens", "2", *extra]  # fmt: skip
    env = {
        **os.environ,
        "BLAZR_PROGRESS_DELAY": "0",
        "BLAZR_QUANT_CACHE": str(cache),
        "PYTHONPATH": str(REPO / "src"),
    }
    env.pop("BLAZR_LOG", None)
    if not tty:
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
        return run.returncode, run.stderr
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a real terminal's size
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=follower, env=env, cwd=REPO
    )
    os.close(follower)
    out = bytearray()
    while True:
        ready, _, _ = select.select([leader], [], [], 300)
        if not ready:
            proc.kill()
            raise AssertionError(f"no output for 300 s: {out.decode(errors='replace')[-2000:]}")
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal's last writer closed it
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.wait(timeout=60), out.decode(errors="replace")


def test_bars_show_on_a_terminal_only(tiny: Path, tmp_path: Path) -> None:
    status, shown = _generate(tiny, tmp_path / "a", tty=True)
    assert status == 0, shown
    assert f"loading {tiny.name}" in shown and "tensor" in shown, shown
    assert "writing the quantization cache" in shown, shown
    status, shown = _generate(tiny, tmp_path / "b", tty=False)  # a pipe: quiet
    assert status == 0, shown
    assert "loading" not in shown and "quantization cache" not in shown, shown
    status, shown = _generate(tiny, tmp_path / "c", "--log-level", "warning", tty=True)  # asked for quiet
    assert status == 0, shown
    assert "loading" not in shown and "quantization cache" not in shown, shown


def test_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal by default; never on a non-terminal; off when the user set warning or quieter."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    for level, explicit, on in [("warning", False, True), ("warning", True, False), ("error", True, False),
                                ("info", True, True), ("debug", True, True)]:  # fmt: skip
        progress.configure(level, explicit)
        assert progress.enabled() is on, (level, explicit)
    progress.configure("warning", False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not progress.enabled()


def test_the_first_kernel_compile_shows_a_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compile into an empty cache dir (unoptimised: quick) counts its files on a terminal."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("BLAZR_PROGRESS_DELAY", "0")
    progress.configure("warning", False)
    path = kernel_build.build(("-O0", "-fopenmp"), out_dir=tmp_path)
    assert path.is_file()
    sources = sum(1 for p in kernel_build.CSRC.glob("*.c"))
    assert f"compiling blazr kernels ({path.stem})" in err.getvalue()
    assert f"/{sources + 1} [" in err.getvalue(), err.getvalue()[-500:]  # files counted
