"""Types, checked: the package and a sample application pass `mypy --strict` (the pinned mypy that
clients/test.sh installs), a sample of mistakes is refused line by line, and the sample runs."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import unittest

import redis
import redis.asyncio
from support import CLIENT_DIR, Server

SAMPLES = os.path.join(CLIENT_DIR, "tests", "samples")
sys.path.insert(0, SAMPLES)


def mypy(*paths: str) -> "subprocess.CompletedProcess[str]":
    cache = os.path.join(CLIENT_DIR, ".venv", ".mypy_cache")
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-color-output", "--cache-dir", cache, *paths],
        cwd=CLIENT_DIR, capture_output=True, text=True, timeout=600,
    )


class TypingTest(unittest.TestCase):
    def test_the_package_and_the_sample_app_pass_mypy_strict(self):
        done = mypy("hourglass_client", os.path.join("tests", "samples", "app.py"))
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("Success: no issues found", done.stdout)
        self.assertTrue(os.path.exists(os.path.join(CLIENT_DIR, "hourglass_client", "py.typed")))

    def test_mypy_refuses_each_mistake_of_the_wrong_sample(self):
        done = mypy(os.path.join("tests", "samples", "wrong.py"))
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        with open(os.path.join(SAMPLES, "wrong.py")) as f:
            marked = {i for i, line in enumerate(f, 1) if "# WRONG" in line}
        flagged = {int(m) for m in re.findall(r"wrong\.py:(\d+): error:", done.stdout)}
        self.assertEqual(flagged, marked, done.stdout)

    def test_the_sample_app_runs(self):
        import app  # tests/samples/app.py

        server = Server()
        try:
            out = app.main(redis.Redis(unix_socket_path=server.socket))
            self.assertEqual(out[0], "True 11")
            self.assertIn("due {\"order\":42}", out)
            self.assertIn("scheduled '' False", out)
            self.assertIn("succeeded at 5", out)
            self.assertIn("o-2 still waits", out)
            self.assertIn("HG_NO_EVENTS", out)
            self.assertIn("True 1 [] sealed 1 None", out)
            self.assertIn("GroupClosed", out)

            async def run():
                r = redis.asyncio.Redis(unix_socket_path=server.socket)
                try:
                    return await app.amain(r)
                finally:
                    await r.aclose()

            out = asyncio.run(run())
            self.assertEqual(out, ["[True]", "due scheduled", "10", "a-2 still waits", "sealed sealed"])
        finally:
            server.close()


if __name__ == "__main__":
    unittest.main()
