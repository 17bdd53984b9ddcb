"""Record real rank observations of collectors/ranks for tests/data/host: a spinning "rank" pinned to
one CPU alone (calm), with four spinning burners pinned to the same CPU (contention), SIGSTOPped
(stopped), killed (gone). The unit tests of perfd.analytics.incidents.host_evidence read them.

    python tests/data/host/record_obs.py [CPU]   # from the repository root; writes rank_observations.json
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from perfd.collectors.ranks import RanksCollector

SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


def main() -> None:
    cpu = sys.argv[1] if len(sys.argv) > 1 else str(max(os.sched_getaffinity(0)))
    rank = subprocess.Popen([sys.executable, "-c", SPIN, cpu], start_new_session=True)
    c = RanksCollector({"job": "j", "event_every_s": 0})
    c.note(rank.pid, 0, "hook", uid=os.getuid())

    def payload(n: int) -> dict[str, Any]:
        out = None
        for _ in range(n):
            time.sleep(0.8)
            out = c.collect(time.time())
        assert out is not None
        return dict(out.events[0]["payload"])

    payload(2)
    calm = payload(1)
    burners = [subprocess.Popen([sys.executable, "-c", SPIN, cpu], start_new_session=True) for _ in range(4)]
    contention = payload(4)
    for b in burners:
        b.kill()
        b.wait()
    os.kill(rank.pid, signal.SIGSTOP)
    stopped = payload(3)
    rank.send_signal(signal.SIGCONT)
    rank.kill()
    rank.wait()
    gone = payload(1)
    doc = {"what": "collectors/ranks rank_processes payloads recorded on the 2-core development VM "
                   "(python tests/data/host/record_obs.py): a spinning rank pinned to one CPU alone (calm), "
                   "with 4 spinning burners pinned to it (contention), SIGSTOPped (stopped), killed (gone)",
           "burners": [b.pid for b in burners], "rank_pid": rank.pid,
           "calm": calm, "contention": contention, "stopped": stopped, "gone": gone}
    Path(__file__).with_name("rank_observations.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
