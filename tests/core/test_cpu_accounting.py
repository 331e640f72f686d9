"""CPU seconds of a service's process tree (sense7.processes.tree_cpu_seconds, CpuMeter), the crowd benchmark's
per-service figure: read back from real processes that burn a known amount of CPU, a grandchild included, before
and after it ends and is reaped (its seconds move to its parent's account, neither lost nor counted twice)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from sense7.processes import CpuMeter, tree_cpu_seconds

# Each burns until its own CPU clock reaches the figure: CPU seconds, whatever the machine's load.
CHILD = textwrap.dedent("""
    import subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", '''
    import sys, time
    while time.process_time() < 1.0:
        pass
    print("burnt", flush=True)
    sys.stdin.readline()
    '''], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    grandchild.stdout.readline()
    while time.process_time() < 0.3:
        pass
    print("burnt", flush=True)
    sys.stdin.readline()
    grandchild.stdin.write("end\\n")
    grandchild.stdin.flush()
    grandchild.wait()
    print("reaped", flush=True)
    sys.stdin.readline()
""")


def test_a_process_tree_s_cpu_seconds_before_and_after_a_descendant_ends():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        idle = CpuMeter({"service": [child.pid], "elsewhere": []})
        assert child.stdout.readline() == "burnt\n"
        alive = tree_cpu_seconds(child.pid)
        assert alive >= 1.2  # the grandchild's 1.0 s (living) and the child's 0.3 s, less /proc's rounding to ticks
        idle.start()
        child.stdin.write("next\n")
        child.stdin.flush()
        assert child.stdout.readline() == "reaped\n"
        reaped = tree_cpu_seconds(child.pid)
        assert reaped >= alive  # the ended grandchild's seconds are in its parent's account: not lost
        assert reaped < alive + 0.5  # ... and not counted twice (that would add its 1.0 s)
        spent = idle.stop()
        assert set(spent) == {"service", "elsewhere"} and spent["elsewhere"] == 0.0
        assert 0.0 <= spent["service"] < 0.5  # the interval saw only the hand-over, not the burn before it
    finally:
        child.kill()
        child.wait()
    assert tree_cpu_seconds(child.pid) == 0.0  # gone: nothing to read
