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

    def test_the_readme_examples_run(self):
        readme = os.path.join(os.path.dirname(TOUR), "..", "..", "README.md")
        with open(readme, encoding="utf-8") as f:
            text = f.read()
        section = text[text.index("## From Python") :]
        section = section[: section.index("\n## ", 1)]
        blocks = section.split("```python\n")[1:]
        self.assertEqual(len(blocks), 3, "the ten-line example, the longer one, the listener")
        for i, block in enumerate(blocks):
            code = block[: block.index("```")]
            name = f"README.md (From Python, example {i + 1})"
            exec(compile(code, name, "exec"), {"__name__": "readme"})
