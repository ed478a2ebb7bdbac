"""The capability report's vocabulary: its JSON schema version and what each status means. Shared by
the report and the command line, whose `--help` prints it without importing torch."""

from __future__ import annotations

import textwrap

SCHEMA = 2  # the JSON's layout version: bumped whenever a field changes meaning or is removed

STATUSES = {
    "selected": "runs here: the first implementation of the priority in force with nothing against it",
    "fallback": "runs here in place of a native path that cannot (a stand-in variant such as triton[w8a16] "
                "on GPUs without FP8 tensor cores, or a later backend because the earlier ones cannot run)",
    "available": "could run here, but one earlier in the priority runs, or it is opt-in (it changes numerics "
                 "by choice, as torch[bf16_dequant]) and runs only where named",
    "unavailable": "cannot run here; the reason says why",
}
NUMERICS_HELP = "the implementation departs from the numerics contract as described (warned once when it runs)"
STATUS_HELP = "\n".join(textwrap.fill(text, 100, initial_indent=f"  {name:<15} ", subsequent_indent=" " * 18)
                        for name, text in (*STATUSES.items(), ("[numerics: …]", NUMERICS_HELP)))
