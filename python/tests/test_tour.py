"""Runs `python/examples/tour.py`: open, write, restart with lazy restore, warm, fence a stale
writer, each claim checked by the example itself."""

import os
import subprocess
import sys

from support import TIMEOUT, TempDirTest

TOUR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "tour.py")


class TourTest(TempDirTest):
    def test_the_tour_runs_and_tells_a_true_story(self):
        done = subprocess.run(
            [sys.executable, TOUR, self.dir], capture_output=True, text=True, timeout=TIMEOUT
        )
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        for line in (
            "200 rooms pending, none restored",
            "The first touch restored room-7 alone",
            "A warm restored the other 199 rooms",
            "The stale writer's append raised PC_FENCED",
            "Tour done.",
        ):
            self.assertIn(line, done.stdout)

    def test_the_readme_snippet_runs(self):
        readme = os.path.join(os.path.dirname(TOUR), "..", "..", "README.md")
        with open(readme, encoding="utf-8") as f:
            text = f.read()
        section = text[text.index("## From Python") :]
        code = section[section.index("```python\n") + len("```python\n") :]
        code = code[: code.index("```")]
        exec(compile(code, "README.md (From Python)", "exec"), {"__name__": "readme"})
