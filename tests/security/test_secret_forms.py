"""No secret on a command line reaches what perfd serves (issue 54 item 7): 9 of 12 planted secrets
were served in stall evidence, and 22 of 35 forms passed the old deny-list. The redaction is now an
allow-list (perfd/redact.py); here a fixed list of 55 forms — every one the issue names, env-style
KEY=VALUE, URLs with user information, headers, and the token formats of major providers — each
checked alone, all together on one command line, through the GPU process list, and live: a real job
whose command line holds all of them stalls, the real agent dumps its stack (py-spy prints the command
line), and every endpoint of the real aggregator, every log and every file the run wrote is searched.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from collectors.nvml.processes import GpuProcess, ProcessTracker
from perfd.procinfo import CMDLINE_MAX, REDACTED, redact_cmdline, shown_cmdline
from tests.procs import Procs, http_get, start_agent, start_aggregator, wait_for


def _tok(prefix: str, n: int, i: int, alphabet: str = "A") -> str:
    """A token of a provider's shape carrying a unique marker (``Q<i>Z``)."""
    mark = f"Q{i:02d}Z"
    return prefix + mark + alphabet * (n - len(mark))


# (form on the command line, the secret that must not appear). Each secret carries a unique marker.
FORMS: list[tuple[str, str]] = [
    ("--db-password=Q01Zpw", "Q01Zpw"),
    ("--dbpassword=Q02Zpw", "Q02Zpw"),
    ("--db_pass=Q03Zpw", "Q03Zpw"),
    ("--pass Q04Zpw", "Q04Zpw"),
    ("-pQ05Zpw", "Q05Zpw"),  # mysql -pX
    ("PGPASSWORD=Q06Zpw", "Q06Zpw"),
    ("postgres://app:Q07Z/pw@db.internal:5432/prod", "Q07Z"),  # a URL password containing '/'
    ("redis://:Q08Zpw@cache:6379/0", "Q08Zpw"),
    ("HTTPS://user:Q09Zpw@host.example/path", "Q09Zpw"),
    ("-u alice:Q10Zpw", "Q10Zpw"),  # curl -u u:p
    ("-H Authorization: Bearer Q11Ztoken", "Q11Ztoken"),
    ("--passphrase Q12Zpw", "Q12Zpw"),
    ("--wandb-key Q13Zkey", "Q13Zkey"),
    ("--hmac-key=Q14Zkey", "Q14Zkey"),
    (_tok("glpat-", 20, 15, "x"), "Q15Z"),
    (_tok("sk_live_", 24, 16, "x"), "Q16Z"),
    (_tok("AIza", 35, 17, "x"), "Q17Z"),
    (_tok("npm_", 36, 18, "x"), "Q18Z"),
    (_tok("ghp_", 36, 19, "x"), "Q19Z"),
    (_tok("github_pat_", 40, 20, "x"), "Q20Z"),
    (_tok("xoxb-", 30, 21, "1"), "Q21Z"),
    (_tok("AKIA", 16, 22, "X"), "Q22Z"),
    ("aws_secret_access_key=Q23Zkey", "Q23Zkey"),
    ("AWS_SECRET_ACCESS_KEY=Q24Zkey", "Q24Zkey"),
    ("WANDB_API_KEY=Q25Zkey", "Q25Zkey"),
    ("HF_TOKEN=Q26Ztok", "Q26Ztok"),
    (_tok("hf_", 34, 27, "x"), "Q27Z"),
    (_tok("sk-proj-", 40, 28, "x"), "Q28Z"),
    (_tok("sk-ant-api03-", 40, 29, "x"), "Q29Z"),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJRMzBaIn0.Q30Zsignature", "Q30Z"),  # a JWT
    ("--api-key=Q31Zkey", "Q31Zkey"),
    ("--token Q32Ztok", "Q32Ztok"),
    ("--secret=Q33Zsec", "Q33Zsec"),
    ("--client-secret Q34Zsec", "Q34Zsec"),
    ("--aws-access-key-id Q35Zid", "Q35Zid"),
    ("--private-key-file=/keys/Q36Z.pem", "Q36Z"),
    ("-P Q37Zpw", "Q37Zpw"),  # redis-cli, ftp
    ("--auth Q38Zpw", "Q38Zpw"),
    ("-H Cookie: session=Q39Zcookie", "Q39Zcookie"),
    ("-H X-Api-Key: Q40Zkey", "Q40Zkey"),
    ("mongodb+srv://admin:Q41Zpw@cluster0.example.net/db", "Q41Zpw"),
    ("amqp://guest:Q42Zpw@rabbit//", "Q42Zpw"),
    ("https://Q43Ztoken@github.com/org/repo.git", "Q43Ztoken"),  # a token as the user information
    (_tok("ya29.", 30, 44, "x"), "Q44Z"),
    ("SG." + "Q45Z" + "x" * 18 + "." + "y" * 22, "Q45Z"),
    ("--credentials Q46Zcred", "Q46Zcred"),
    ("DATABASE_URL=postgresql://u:Q47Zpw@h/db", "Q47Zpw"),
    ("--conn-str Server=x;Password=Q48Zpw;", "Q48Zpw"),
    ("htpasswd -b users.db alice Q49Zpw", "Q49Zpw"),  # a positional password
    ("--ssh-passphrase=Q50Zpw", "Q50Zpw"),
    ("DefaultEndpointsProtocol=https;AccountName=a;AccountKey=Q51Z" + "x" * 30 + ";", "Q51Z"),
    ("--sas-token Q52Ztok", "Q52Ztok"),
    ("--otp Q53Z123", "Q53Z123"),
    ("-pass pass:Q54Zpw", "Q54Zpw"),  # openssl
    ("sshpass -p Q55Zpw ssh host", "Q55Zpw"),
]
MARKERS = [secret for _, secret in FORMS]


def test_the_list_holds_the_issues_forms_and_more() -> None:
    assert len(FORMS) >= 40 and len(set(MARKERS)) == len(MARKERS)
    issue = ("PGPASSWORD=", "--dbpassword=", "--db_pass=", "--pass ", "-p", "redis://:", "HTTPS://", "-u ",
             "Authorization: Bearer", "--passphrase", "--wandb-key", "--hmac-key", "glpat-", "sk_live_",
             "AIza", "npm_")
    assert all(any(form.startswith(f) or f in form for form, _ in FORMS) for f in issue)


@pytest.mark.parametrize(("form", "secret"), FORMS, ids=[s for _, s in FORMS])
def test_each_form_is_masked(form: str, secret: str) -> None:
    for cmd in (f"python train.py {form}", f"{form} python train.py --lr 3e-4",
                f"torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 24 {form} --bf16"):
        out = redact_cmdline(cmd)
        assert secret not in out, (cmd, out)
        assert REDACTED in out


def test_all_forms_on_one_command_line_and_what_is_kept() -> None:
    cmd = ("python -u -m torch.distributed.run --nproc_per_node 8 --master_addr 10.1.2.3 pretrain_gpt.py "
           "--num-layers 24 --hidden-size 2048 --lr 3e-4 --tokenizer-type GPT2BPETokenizer "
           "--data-path /data/owt_text_document --bf16 --tensor-model-parallel-size 2 configs/gpt.yaml "
           + " ".join(f for f, _ in FORMS))
    out = redact_cmdline(cmd)
    assert not [s for s in MARKERS if s in out], out
    # What a person needs to read the job stays: program, launcher options, script, model options.
    assert out.startswith("python -u -m torch.distributed.run --nproc_per_node 8 --master_addr 10.1.2.3 "
                          "pretrain_gpt.py --num-layers 24 --hidden-size 2048 --lr 3e-4 --tokenizer-type "
                          "GPT2BPETokenizer --data-path /data/owt_text_document --bf16 "
                          "--tensor-model-parallel-size 2 configs/gpt.yaml ")
    # Names stay, values go.
    assert "--db-password=<redacted>" in out and "PGPASSWORD=<redacted>" in out and "-p<redacted>" in out
    assert "--wandb-key <redacted>" in out


def test_no_safe_name_is_a_secrets() -> None:
    """The allow-list itself: no option or variable on it has a secret word among its parts."""
    from perfd.redact import SAFE_OPTIONS, SAFE_VARIABLES, SECRET_PARTS

    for name in SAFE_OPTIONS | SAFE_VARIABLES:
        assert not set(re.split(r"[-.]", name)) & SECRET_PARTS, name
    # A dotted name is safe by its last part, unless a part is a secret word.
    assert redact_cmdline("python t.py --training.steps 10 --wandb.api-key X9") == \
        "python t.py --training.steps 10 --wandb.api-key <redacted>"


def test_the_gpu_process_list_and_a_stack_carry_none() -> None:
    """The job's own process on a GPU (its command line shown, cut to 200 characters: each form first)
    and py-spy's dump of it (its command line on the first line)."""
    from perfd.agent import stacks

    redact_stack = getattr(stacks, "redact_stack", redact_cmdline)
    for form, secret in FORMS:
        cmd = f"python train.py {form} --lr 1e-4"
        t = ProcessTracker(60.0, lookup=lambda pid, c=cmd: ("python", c),  # type: ignore[misc]
                           env_lookup=lambda pid: {"rank": 0}, user_lookup=lambda pid: "alice")
        ev = t.update({"gpu": "0"}, [GpuProcess(100, 1 << 30)], now=0.0)
        assert ev is not None
        shown = ev["payload"][0]["cmdline"]
        assert shown is not None and secret not in shown and shown == shown_cmdline(cmd, True, CMDLINE_MAX)
        stack = f"Process 4242: {cmd}\nPython v3.12.3 (/usr/bin/python3.12)\n\nThread 4242 (idle): " \
                f"\"MainThread\"\n    <module> (train.py:6)\n"
        assert secret not in redact_stack(stack)


def _every_event(base: str) -> str:
    """Every page of /api/events, from the first."""
    pages, cursor = [], 0
    for _ in range(1000):
        page = json.loads(http_get(f"{base}/api/events?cursor={cursor}"))
        pages.append(json.dumps(page))
        if not page["more"] or page["next_cursor"] == cursor:
            break
        cursor = page["next_cursor"]
    return "\n".join(pages)


LOOP = """
import time
from perfd.hook import StepHook
hook = StepHook(cuda=False, rank=0, flush_interval_s=0.05)
while True:
    with hook.step():
        time.sleep(0.01)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_stalled_job_with_every_form_on_its_command_line_leaks_none(tmp_path: Path) -> None:
    """The issue's run: secrets on a rank's command line, a stall, the stacks in the incident's
    evidence. Every endpoint of the aggregator, the agent's and the aggregator's logs, and every file
    under the run's folder (the agent's spool and state included) are searched for each marker."""
    sock = str(tmp_path / "hook.sock")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"batch_interval_s: 0.5\nstate_dir: {tmp_path / 'agent-state'}\ncollectors:\n"
                   f"  hook: {{socket_path: {sock}}}\n  ranks: {{interval_s: 1.0}}\n")
    (tmp_path / "loop.py").write_text(LOOP)
    argv = [sys.executable, str(tmp_path / "loop.py"), *" ".join(f for f, _ in FORMS).split(" ")]
    with Procs(tmp_path) as procs:
        grpc_port, _, base = start_aggregator(procs, "--rules-interval", "1", "--state-dir",
                                              str(tmp_path / "agg-state"))
        start_agent(procs, grpc_port, "--job", "own", "--host", "off", "--node", "n1", "--spool-dir",
                    str(tmp_path / "spool"), nvml="off", config=cfg)
        wait_for(lambda: os.path.exists(sock), 30, "the agent's hook socket")
        job = procs.start("job", argv, env={"PERFD_HOOK_SOCKET": sock})
        wait_for(lambda: ((json.loads(http_get(f"{base}/api/jobs"))["jobs"] or [{}])[0]
                          .get("iterations_seen") or 0) >= 30, 60, "the job's steps at the aggregator",
                 ignore=(OSError, ValueError, KeyError, IndexError))
        os.kill(job.pid, signal.SIGSTOP)
        try:
            stack = wait_for(lambda: next(((i["evidence"]["stall"].get("stacks") or {}).get("0")
                                           for i in json.loads(http_get(f"{base}/api/jobs/own/incidents"))[
                                               "incidents"] if "stall" in i["kinds"]), None),
                             90, "the stopped rank's stack", interval=0.5, ignore=(OSError, KeyError))
            assert "stack" in stack and f"Process {job.pid}" in stack["stack"], stack
            assert "loop.py --db-password=<redacted>" in stack["stack"]  # the command line, redacted
            served = {path: http_get(f"{base}{path}").decode() for path in (
                "/metrics", "/healthz", "/api/stats", "/api/jobs", "/api/captures", "/api/jobs/own/summary",
                "/api/jobs/own/iterations", "/api/jobs/own/incidents", "/api/jobs/own/gpus")}
            served["/api/events"] = _every_event(base)
        finally:
            os.kill(job.pid, signal.SIGCONT)
        report = subprocess.run([sys.executable, "-m", "perfd.cli", "report", "--aggregator", base,
                                 "--job", "own", "--html", "-"], capture_output=True, text=True, timeout=120)
        assert report.returncode == 0 and "<html" in report.stdout, report.stderr[-2000:]
        served["perfd report"] = report.stdout + report.stderr
    leaks = {where: [s for s in MARKERS if s in text] for where, text in served.items()}
    assert not any(leaks.values()), leaks
    # Every file the run wrote: logs, the agent's spool and state, the aggregator's state store.
    found: dict[str, list[str]] = {}
    for p in tmp_path.rglob("*"):
        if p.is_file() and p.name not in ("job.out", "loop.py") and not p.is_symlink():
            text = p.read_bytes().decode("utf-8", "replace")
            hit = [s for s in MARKERS if s in text]
            if hit:
                found[str(p.relative_to(tmp_path))] = hit
    assert not found, found
    assert (tmp_path / "agent.out").exists() and (tmp_path / "aggregator.out").exists()
