"""`perfd launch` in the test's process: perfd's own ``run_launch`` on a thread of the test, for the tests
whose subject is what the launch sets up (its manifest, its log and line times, the environment it gives
the job) and what the pipeline makes of the job, not the launch's own process. The job it starts is a
process, as under the command; no interpreter is started for `perfd launch` itself.

On a thread other than the main one the launch installs no signal forwarding (signal handlers are the
main thread's), so :meth:`InLaunch.stop` ends the job by its process group (the launch starts it in a
session of its own, its pid the group's, written in the manifest) and the launch then returns as it
does when its job ends.

    launch = InLaunch(LaunchOptions([sys.executable, "train.py"], job="j", run_dir=str(run)),
                      tmp_path / "launch.out").start()
    try:
        assert launch.wait(60) == 0, launch.output()
    finally:
        launch.stop()
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

from perfd.app.launcher import LaunchOptions, plan_launch, run_launch
from tests.procs import wait_for


class InLaunch:
    """``run_launch(opts)`` on a thread; the job's output (and the launch's own lines) in ``out``."""

    def __init__(self, opts: LaunchOptions, out: Path) -> None:
        self.opts, self.out = opts, out
        # where the launch will write its manifest: its own plan, made again by run_launch (a plan makes
        # the run's folder, which a second plan finds made)
        self.manifest = plan_launch(opts).manifest_path
        self.rc: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="in-launch", daemon=True)

    def _run(self) -> None:
        try:
            with self.out.open("wb") as terminal, self.out.with_suffix(".err").open("w") as err:
                self.rc = run_launch(self.opts, terminal=terminal, err=err)
        except BaseException as exc:  # said by wait(), not lost with the thread
            self.error = exc

    def start(self) -> InLaunch:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def manifest_written(self, timeout: float = 30.0) -> Path:
        """The manifest, once the launch wrote it (its job started); fails at once if the launch
        returned without one (its job not started: the launch's lines say why)."""

        def there() -> bool:
            if self.manifest.exists():
                return True
            if not self.running:
                raise AssertionError(f"perfd launch returned ({self.rc}, {self.error!r}) before writing "
                                     f"{self.manifest}: {self.output()[-2000:]}")
            return False

        wait_for(there, timeout, "the launch manifest", interval=0.05)
        return self.manifest

    def wait(self, timeout: float) -> int:
        """The launch's exit status, once it returned within ``timeout`` seconds (AssertionError if not)."""
        self._thread.join(timeout)
        if self.error is not None:
            raise AssertionError(f"perfd launch raised: {self.error!r}") from self.error
        assert not self._thread.is_alive() and self.rc is not None, \
            f"perfd launch still running after {timeout} s: {self.output()[-2000:]}"
        return self.rc

    def output(self) -> str:
        """What the job printed and the launch said, as far as they got."""
        files = (self.out, self.out.with_suffix(".err"))
        return "\n".join(f.read_text(errors="replace") for f in files if f.exists())

    def stop(self, grace_s: float = 15.0) -> None:
        """End the job (SIGTERM to its process group, SIGKILL after ``grace_s``) and the launch with it;
        AssertionError if the launch still runs after that (a job left running is said, not leaked)."""
        if not self._thread.is_alive():
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:  # the manifest's pid: the job's, which leads its own process group
                pid = int(json.loads(self.manifest.read_text())["pid"])
            except (OSError, ValueError, KeyError, TypeError):  # no manifest yet: no job to signal yet
                pid = None
            if pid is not None and self._thread.is_alive():  # (once it returned, the pid may be another's)
                try:
                    os.killpg(pid, sig)
                except ProcessLookupError:  # ended meanwhile
                    pass
            self._thread.join(grace_s)
            if not self._thread.is_alive():
                return
        raise AssertionError(f"perfd launch still running after SIGKILL to its job: {self.output()[-2000:]}")
