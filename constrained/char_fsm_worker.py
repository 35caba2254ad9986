"""Builds a regex's character FSM in a separate process: pattern on stdin, JSON on stdout.

    echo -n '[0-9]+' | python -m radixgen.constrained.char_fsm_worker

interegular is pure Python and holds the GIL for seconds on a large schema; in its own process
it cannot slow the scheduler, and a build that runs too long can be killed.
"""

from __future__ import annotations

import subprocess
import sys

from radixgen.constrained.char_automaton import CharFsmTable


def build_char_fsm_table(pattern: str) -> CharFsmTable:
    """In this process (see `build_char_fsm_table_in_subprocess` for the isolated variant)."""
    from radixgen.constrained.regex_index import regex_char_fsm

    return CharFsmTable.from_interegular(regex_char_fsm(pattern))


def build_char_fsm_table_in_subprocess(pattern: str, *, timeout_s: float) -> CharFsmTable:
    """Runs `build_char_fsm_table` in a fresh interpreter.

    Raises:
        subprocess.TimeoutExpired: the build took longer than `timeout_s` (the process is killed).
        RuntimeError: the worker failed (its stderr is in the message).
    """
    completed = subprocess.run(
        [sys.executable, "-m", "radixgen.constrained.char_fsm_worker"],
        input=pattern.encode(),
        capture_output=True,
        timeout=timeout_s,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"char FSM worker failed: {completed.stderr.decode()[-500:]}")
    return CharFsmTable.from_json(completed.stdout.decode())


def main() -> None:
    pattern = sys.stdin.buffer.read().decode()
    sys.stdout.write(build_char_fsm_table(pattern).to_json())


if __name__ == "__main__":
    main()
