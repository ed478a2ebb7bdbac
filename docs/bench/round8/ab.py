"""The A/B harness of round 8's probes: run a probe's `--measure` in fresh processes, alternately on an
earlier tree (OLD) and on this one, so that a slow moment of the host cannot land on one side only."""
import json
import os
import subprocess
import sys


def alternate(script: str, old: str, rounds: int) -> dict[str, list]:
    """{"old": [...], "new": [...]}: the JSON each `python3 script --measure` printed last, per round,
    with OLD's `quantcore` first on the path, then this directory's (the order swapping every round)."""
    old, here = os.path.abspath(old), os.getcwd()
    results = {"old": [], "new": []}
    for r in range(rounds):
        for label, tree in (("old", old), ("new", here)) if r % 2 == 0 else (("new", here), ("old", old)):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]))
            out = subprocess.run([sys.executable, script, "--measure"], env=env, capture_output=True, text=True)
            if out.returncode:
                print(out.stderr[-3000:])
                continue
            results[label].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r} {label} done", flush=True)
    return results
