"""Packaging, as a user meets it: `pip wheel` from the source tree leaves nothing in it, the wheel
carries the scripts, py.typed and the one version, and installed into a fresh venv (redis-py from
PyPI), this README's examples run as they are, copied and pasted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import zipfile

from support import CLIENT_DIR, Server

import hourglass_client as hg


def tree(root: str) -> set:
    """The files under ``root`` but for the test venv and bytecode caches."""
    found = set()
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in (".venv", "__pycache__", ".mypy_cache")]
        found.update(os.path.relpath(os.path.join(top, f), root) for f in files)
    return found


def readme_blocks() -> list:
    with open(os.path.join(CLIENT_DIR, "README.md")) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def settle(r, task_id: bytes) -> None:
    """What a host does when it runs ``task_id`` of report.build: takes it and appends its ending."""
    deadline = time.monotonic() + 60
    while r.zscore("hourglass:{report.build}:due", task_id) is None:
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    time.sleep(0.2)
    r.zrem("hourglass:{report.build}:due", task_id)
    r.xadd("hourglass:{report.build}:events", {"id": task_id, "outcome": "succeeded", "attempt": 1,
                                               "finished_ms": 1767600000000})


class PackagingTest(unittest.TestCase):
    def test_the_wheel_installs_into_a_fresh_venv_and_the_readme_runs(self):
        before = tree(CLIENT_DIR)
        with tempfile.TemporaryDirectory(prefix="hourglass-py-pkg-") as tmp:
            dist = os.path.join(tmp, "dist")
            run(sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
                CLIENT_DIR, "-w", dist)
            self.assertEqual(tree(CLIENT_DIR), before, "pip wheel left files in the source tree")
            (wheel,) = os.listdir(dist)
            self.assertEqual(wheel, f"hourglass_client-{hg.__version__}-py3-none-any.whl")
            with zipfile.ZipFile(os.path.join(dist, wheel)) as z:
                names = set(z.namelist())
                metadata = z.read(f"hourglass_client-{hg.__version__}.dist-info/METADATA").decode()
            self.assertIn("hourglass_client/py.typed", names)
            self.assertIn("hourglass_client/scripts/prelude.lua", names)
            self.assertIn(f"Version: {hg.__version__}\n", metadata)

            venv = os.path.join(tmp, "venv")
            run(sys.executable, "-m", "venv", venv)
            python = os.path.join(venv, "bin", "python")
            run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", os.path.join(dist, wheel))
            server = Server()
            try:
                env = dict(os.environ, REDIS_URL=f"unix://{server.socket}")
                env.pop("PYTHONPATH", None)
                # The Sentinel example (the second block) needs sentinels: tests/test_sentinel.py runs its calls.
                quick_start, _sentinel, waiting, async_example = readme_blocks()
                # Run outside the source tree, so that only the installed package can be imported.
                out = run(python, "-c", quick_start, env=env, cwd=tmp).stdout
                self.assertIn("1000 scheduled in bulk", out)
                self.assertIn("due b'{\"order\":42}'\nscheduled\n1000\n", out)
                self.assertIn("Sealed(state=<SealState.SEALED: 'sealed'>, fired=None)", out)
                self.assertIn('too late: group "o-17" is sealed: no children can be added', out)
                out = run(python, "-c", async_example, env=env, cwd=tmp).stdout
                self.assertEqual(out, "scheduled\n")
                # The wait example goes on from the quick start; this test plays the host that runs r-1.
                r = server.client()
                r.flushall()
                r.xadd("hourglass:{report.build}:events", {"id": "other", "outcome": "succeeded", "attempt": 1})
                host = threading.Thread(target=settle, args=(r, b"r-1"))
                host.start()
                out = run(python, "-c", quick_start + waiting, env=env, cwd=tmp).stdout
                host.join()
                self.assertTrue(out.endswith("r-1 succeeded at 1767600000000\n"), out)
                version = run(python, "-c", "import hourglass_client; print(hourglass_client.__version__)", cwd=tmp)
                self.assertEqual(version.stdout.strip(), hg.__version__)
            finally:
                server.close()
        self.assertEqual(tree(CLIENT_DIR), before)


if __name__ == "__main__":
    unittest.main()
