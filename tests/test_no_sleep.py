"""No test sleeps to let time pass, unless it is on the allow-list below with its reason.

A sleep in a test waits for real time: under load the time it waits for is not the time the test
meant, and the test reads the machine, not the code (the alternating-steps hook test read perfd's
jitter as 0.333 against a bound of 0.255 once, from a step of sleep(10 ms) that wandered). Where the
code under test reads a clock, the test moves that clock (tests/hook/sim_clock.py for the step hook,
``KinetoDaemon(clock=...)``, the aggregator's perfd.core.clock.ManualClock and its tick); where it waits for
another thread or process, it polls for the state with a deadline that bounds a failure only.

The scan reads every tests/**/*.py and perfd/collectors/*/tests/**/*.py (an AST, so code in strings, run by
child processes, is not test code here) for calls of ``time.sleep`` and ``asyncio.sleep`` (under any name
they are imported as). Each site is named ``path::function`` (nested functions and methods dotted); a name
missing from ALLOWED fails, and so does an entry with no sleep left in it, so the list only shrinks.
``asyncio.sleep(0)`` yields to the event loop and waits for no time: not counted. Scripts run by hand
(tests/gpu and tests/data, other than their test_*.py modules) are not collected by pytest and not
scanned."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# the scan is made once, by the module fixture: one xdist worker runs the module
pytestmark = pytest.mark.xdist_group("no_sleep")
SCRIPT_DIRS = ("tests/gpu/", "tests/data/")  # their files other than test_*.py are scripts run by hand

# The reasons a sleep stays. A new one needs its own reason, said as plainly.
POLL = ("polls with a deadline for a state another thread or process reaches; the deadline bounds a "
        "failure only")
LOOP = ("a real training loop's input wait or work (DataLoader workers, a framework's trainer) that the hook "
        "under test times on the real clock: the time is what is measured")
LOOP_AND_POLL = f"{LOOP}; and {POLL}"
STANDIN = ("a stand-in (hook, rank, profiler, a report being written) answering from its own thread, "
           "paced as the real one is, while the code under test waits on its real clock")
HOLD = ("a stand-in made slow on purpose: it holds a thread, the interpreter's lock or the event loop while "
        "the behaviour under test happens")
SCHEDULE = ("paces a feed or a fault against real processes or streams (agents, aggregators, shards, NATS, "
            "a stopped rank): the spacing is part of the scenario")
POLL_AND_SCHEDULE = f"{POLL}; and {SCHEDULE}"
TIMER = ("lets a real component's own timer pass (a tick, a lease or TTL, the stall limit, a checkpoint "
         "interval) in a process or server that has no injected clock")
QUIET = ("a fixed wait before a reading that has no event to wait for: something must not happen (a "
         "redelivery, a double, a late write, a command to the wrong agent) or a process must settle (RSS)")
WINDOW = ("the process boundary under test: a collector reads real processes' (or a GPU's) counters over a "
          "window of real time")
LAG_PROBE = "a probe ticking on the event loop to time its lag: the lag is what is measured"
CHILD = "the program a test starts as a real process (a hooked training loop): its own steps and pauses"
GUARD = "the suite's leftover-process guard: a bounded moment for the processes a test left to exit"

ALLOWED: dict[str, str] = {
    "perfd/collectors/hook/tests/test_hook_collector.py::collect_until": POLL,
    "perfd/collectors/hook/tests/test_hook_collector.py::test_step_records_from_two_ranks": LOOP,
    "perfd/collectors/hook/tests/test_hook_collector.py::"
    "test_at_stop_what_no_collect_took_is_handed_over_from_the_queue_and_the_socket": POLL,
    "perfd/collectors/hook/tests/test_hook_collector.py::test_malformed_datagrams_are_counted": POLL,
    "perfd/collectors/hook/tests/test_hook_jobs.py::_collect": POLL,
    "perfd/collectors/hook/tests/test_hook_pauses.py::"
    "test_an_announced_save_and_evaluation_are_timed_onto_the_next_record.pause": LOOP,
    "perfd/collectors/hook/tests/test_hook_pauses.py::"
    "test_an_announced_save_and_evaluation_are_timed_onto_the_next_record.run_rank": LOOP,
    "perfd/collectors/host/tests/test_host.py::test_real_psutil_values_in_range": WINDOW,
    "perfd/collectors/nccl/tests/test_collector.py::test_trigger_read_dedupe_and_hang_event": TIMER,
    "perfd/collectors/ranks/tests/test_ranks.py::_collect": WINDOW,
    "perfd/collectors/ranks/tests/test_ranks.py::_wait_state": POLL,
    "perfd/collectors/ranks/tests/test_ranks.py::test_states_cpu_and_absent_before_two_readings": WINDOW,
    "perfd/collectors/ranks/tests/test_ranks.py::test_the_launch_manifests_tree_gives_the_ranks": POLL,
    "perfd/collectors/ranks/tests/test_ranks.py::test_a_wrapper_declaring_the_rank_is_not_the_rank": POLL,
    "perfd/collectors/ranks/tests/test_ranks.py::test_the_event_goes_out_on_change_and_every_few_seconds_otherwise":
        WINDOW,
    "perfd/collectors/ranks/tests/test_ranks.py::"
    "test_the_event_goes_out_on_change_and_every_few_seconds_otherwise.after": WINDOW,
    "tests/capture/test_hook_trace_run.py::StandInHooks.request_trace.hook": STANDIN,
    "tests/capture/test_kineto_daemon.py::FakeLibkineto.recv": POLL,
    "tests/capture/test_kineto_daemon.py::test_real_torch_process_traces_the_window_its_config_asks": POLL,
    "tests/capture/test_manager.py::FakeRank.run": STANDIN,
    "tests/capture/test_manager.py::_session_range_manager.hook.training": STANDIN,
    "tests/capture/test_manager.py::test_nsys_step_aligned_range_through_the_hook.hook.training": STANDIN,
    "tests/capture/test_kineto_daemon.py::test_real_torch_process_captured_by_the_manager": POLL,
    "tests/capture/test_ncu_capture.py::Job.hook.training": STANDIN,
    "tests/capture/test_nsys_exec.py::test_range_reports_and_wait_stable.grow": STANDIN,
    "tests/captures/test_agent_capture_loop.py::"
    "test_capture_request_reaches_the_agent_and_its_outcome_comes_back.body": POLL,
    "tests/captures/test_agent_stop.py::test_sigterm_with_a_kineto_capture_waiting_for_its_poll": SCHEDULE,
    "tests/captures/test_alertmanager.py::test_alertmanager_alert_becomes_a_capture_command.body": POLL,
    "tests/captures/test_capture_budget_live.py::_until": POLL,
    "tests/captures/test_hook_trace_capture.py::_capture.body": POLL,
    "tests/captures/test_ncu_live_loop.py::"
    "test_ncu_capture_by_request_through_aggregator_agent_and_hook.body": POLL,
    "tests/captures/test_ready_target_live.py::"
    "test_a_rule_firing_before_the_restarted_ranks_hook_is_up_still_captures.body": POLL,
    "tests/collectives/test_launch.py::test_manifest_is_written_while_running": POLL,
    "tests/collectives/test_launch.py::test_the_log_grows_while_the_command_runs": POLL,
    "tests/deploy/test_slurm.py::_wait": POLL,
    "tests/engine/engine_driver.py::Load._main": SCHEDULE,
    "tests/engine/engine_driver.py::nc_call.main": POLL,
    "tests/engine/engine_driver.py::until": POLL,
    "tests/engine/test_engine_collectives_faults.py::"
    "test_a_shard_killed_while_folding_windows_loses_and_doubles_no_figures": SCHEDULE,
    "tests/engine/test_engine_collectives_many.py::"
    "test_step_records_and_collectives_through_the_engine_give_one_aggregators_answer.feed": SCHEDULE,
    "tests/engine/test_engine_faults.py::"
    "test_a_shard_cut_off_from_the_engine_loses_and_doubles_nothing": SCHEDULE,
    "tests/engine/test_engine_faults.py::test_a_shard_killed_mid_run_loses_and_doubles_nothing": SCHEDULE,
    "tests/engine/test_engine_records.py::_until": POLL,
    "tests/engine/test_engine_stall.py::"
    "test_a_stopped_rank_is_a_stall_through_the_engine_its_cause_the_stopped_process": SCHEDULE,
    "tests/engine/test_engine_timers.py::"
    "test_a_consumer_made_with_another_ack_wait_is_set_to_the_shards.main": POLL,
    "tests/engine/test_incremental_answer.py::_first_collective_analysis": POLL,
    "tests/engine/test_incremental_answer.py::"
    "test_a_hang_in_a_costly_collective_analysis_opens_its_incident_without_a_new_step": POLL,
    "tests/engine/test_incremental_answer.py::"
    "test_a_hang_in_a_costly_collective_analysis_opens_its_incident_without_a_new_step.made": POLL,
    "tests/engine/test_late_partials.py::_through_the_engine.folded": POLL,
    "tests/engine/test_natsd.py::"
    "test_cluster_loses_its_stream_leader_without_losing_or_doubling_a_message.main": POLL,
    "tests/engine/test_natsd.py::"
    "test_cluster_loses_its_stream_leader_without_losing_or_doubling_a_message.main.retrying": POLL,
    "tests/engine/test_natsd.py::test_key_value_create_update_and_ttl.main": POLL,
    "tests/engine/test_publisher_close.py::"
    "test_an_agent_whose_close_hangs_connects_afresh_and_publishes_what_waited.main": SCHEDULE,
    "tests/engine/test_same_answer.py::_through_the_engine": POLL_AND_SCHEDULE,
    "tests/engine/test_same_answer_scale.py::_through_the_engine": POLL,
    "tests/engine/test_shard_hold_redelivery.py::_SlowFold.add": HOLD,
    "tests/engine/test_shard_hold_redelivery.py::"
    "test_messages_held_past_their_ack_wait_are_delivered_again_and_counted_so.held_once": HOLD,
    "tests/engine/test_shard_hold_redelivery.py::"
    "test_a_slow_fold_without_holds_is_not_delivered_twice.slowly": HOLD,
    "tests/engine/test_lease_keeper_late.py::_SlowKV.update": HOLD,
    "tests/engine/test_lease_keeper_late.py::_hold": HOLD,
    "tests/engine/test_shard_lease_busy.py::_BusyFold.add": HOLD,
    "tests/engine/test_root_lease_busy.py::_SlowSink.ingest_steps": HOLD,
    "tests/engine/test_root_lead_ends.py::_until": POLL,
    "tests/engine/test_shard_lease_busy.py::OwnLoop._probe": LAG_PROBE,
    "tests/engine/test_shard_lease_busy.py::_beating": SCHEDULE,
    "tests/engine/test_shard_lease_busy.py::"
    "test_a_keeper_not_hearing_from_its_shards_loop_lets_its_leases_go.main": TIMER,
    "tests/engine/test_engine_state.py::"
    "test_the_leaders_read_of_the_streams_is_what_the_engine_says.lead_and_read": POLL,
    "tests/engine/test_stream_skipped.py::"
    "test_records_the_stream_let_go_while_the_root_was_away_are_counted_and_said.lead_until": POLL,
    "tests/faults/test_caps_release.py::_send": SCHEDULE,
    "tests/faults/test_churn_memory.py::_hold": SCHEDULE,
    "tests/faults/test_churn_memory.py::test_an_agent_holding_another_job_stays.main": POLL,
    "tests/faults/test_clean_stop.py::"
    "test_stop_while_a_tick_runs_waits_for_it_before_closing_the_store.main.slow_housekeeping": HOLD,
    "tests/faults/test_log_rotation.py::test_copytruncate_while_running_loses_nothing": SCHEDULE,
    "tests/faults/test_network_faults.py::Writer.run": SCHEDULE,
    "tests/faults/test_network_faults.py::test_blackhole_loses_nothing_and_doubles_nothing": SCHEDULE,
    "tests/faults/test_one_record.py::"
    "test_a_far_future_hook_step_is_refused_and_every_later_step_is_held": SCHEDULE,
    "tests/faults/test_state_disk.py::"
    "test_a_real_full_tmpfs_loses_no_acknowledged_iteration.stream": SCHEDULE,
    "tests/faults/test_state_disk.py::"
    "test_disk_full_while_two_agents_stream_loses_no_acknowledged_iteration.main": SCHEDULE,
    "tests/gpu/test_gpu_real.py::test_real_nvml_collector_reads_every_gpu_and_agrees_with_nvidia_smi": WINDOW,
    "tests/hook/test_any_pytorch_job.py::_collect": POLL,
    "tests/hook/test_any_pytorch_job.py::_live_run.loader": LOOP,
    "tests/hook/test_between_steps.py::Samples.__getitem__": LOOP,
    "tests/hook/test_between_steps.py::_work": LOOP,
    "tests/hook/test_between_steps.py::accumulation_loop": LOOP,
    "tests/hook/test_between_steps.py::run": POLL,
    "tests/hook/test_cpu_only_job.py::_live_run": LOOP_AND_POLL,
    "tests/hook/test_cpu_only_job.py::_live_run.loader": LOOP,
    "tests/hook/test_cpu_only_job.py::test_hugging_face_and_lightning_jobs_without_cuda_are_cpu_jobs": POLL,
    "tests/hook/test_frameworks_real.py::_slow_tokens.SlowTokens.__getitem__": LOOP,
    "tests/hook/test_frameworks_real.py::_to_aggregator": POLL,
    "tests/hook/test_hook_callbacks.py::test_a_trainers_callback_names_its_trainer_to_the_aggregator": POLL,
    "tests/hook/test_hook_cuda_markers.py::test_step_hook_on_the_driver_path_harvests_on_its_thread": POLL,
    "tests/hook/test_hook_cuda_markers.py::"
    "test_step_hook_on_the_torch_api_sets_the_device_on_its_thread": POLL,
    "tests/hook/test_hook_gpus.py::test_a_real_hook_without_rank_names_its_pid_and_device": POLL,
    "tests/hook/test_hook_harvester.py::test_a_forked_child_neither_hangs_nor_sends_twice": POLL,
    "tests/hook/test_hook_harvester.py::wait_until": POLL,
    "tests/hook/test_hook_job_record.py::test_collector_takes_the_hooks_model_into_the_job_spec": POLL,
    "tests/hook/test_hook_job_record.py::test_collector_turns_job_records_into_one_job_info": POLL,
    "tests/hook/test_hook_megatron.py::"
    "test_a_profile_range_opens_at_the_step_the_agent_asks_for.collect": POLL,
    "tests/hook/test_hook_trace.py::Loop.wait_written": POLL,
    "tests/host/hook_loop.py::main": CHILD,
    "tests/host/test_agent_side.py::_drain": POLL,
    "tests/host/test_agent_side.py::test_the_agent_answers_a_stacks_command_with_captures_off": POLL,
    "tests/host/test_agent_side.py::test_the_agent_hands_gpu_and_hook_pids_to_the_ranks_collector": POLL,
    "tests/host/test_data_loader_cpus.py::"
    "test_a_ranks_workers_cpu_is_the_jobs_and_its_full_cpus_call_for_cheaper_transforms": WINDOW,
    "tests/host/test_host_live.py::_stopped_live": SCHEDULE,
    "tests/host/test_stall_aggregator.py::Harness.observe": WINDOW,
    "tests/host/test_stall_aggregator.py::"
    "test_a_pending_collective_corroborates_a_stall_of_busy_ranks.busy_reading": WINDOW,
    "tests/host/test_stall_restart.py::_observe_as_started": WINDOW,
    "tests/integrations/integrations_helpers.py::wait_for": POLL,
    "tests/leftover_procs.py::LeftoverGuard.finish": GUARD,
    "tests/leftover_procs.py::LeftoverGuard.leftovers": GUARD,
    "tests/procs.py::wait_for": POLL,
    "tests/security/test_auth_tls.py::_client_run": SCHEDULE,
    "tests/security/test_auth_tls.py::_until": POLL,
    "tests/security/test_capture_requests.py::"
    "test_hostile_ranks_are_refused_at_the_api_and_the_webhook_and_hold_no_rank.body": POLL,
    "tests/security/test_engine_routes.py::_until": POLL,
    "tests/security/test_engine_routes.py::"
    "test_another_users_nats_server_cannot_join_the_cluster_as_a_route": QUIET,
    "tests/security/test_hook_control.py::Rig.step_until": POLL,
    "tests/security/test_hook_control.py::"
    "test_a_symlink_swap_of_the_senders_address_writes_nothing": SCHEDULE,
    "tests/security/test_hook_control.py::"
    "test_another_user_squatting_ranks_0_to_7_locks_no_real_rank_out": POLL,
    "tests/security/test_hook_senders.py::_collect_until": POLL,
    "tests/security/test_identity_policy.py::_send": SCHEDULE,
    "tests/security/test_step_values.py::"
    "test_a_hook_datagram_with_absurd_numbers_is_counted_and_kept_without_them": POLL,
    "tests/test_agent_failures.py::"
    "test_failures_are_counted_logged_once_and_the_agent_keeps_running.body": POLL,
    "tests/test_host_procs.py::"
    "test_a_runs_leftovers_are_named_and_killed_and_a_busy_neighbour_is_counted": POLL,
    "tests/test_httpd.py::test_answers_waiting_to_be_read_are_bounded_per_connection_and_in_all": POLL,
    "tests/transport/test_admission_storm.py::"
    "test_each_refused_agent_reads_its_hint_and_then_gets_in_on_one_stream.body": POLL,
    "tests/transport/test_admission_storm.py::"
    "test_a_refusal_read_through_a_failed_write_keeps_its_retry_hint.body": POLL,
    "tests/transport/test_transport_collectives.py::test_collectives_cross_a_real_stream.body": POLL,
    "tests/transport/test_transport_e2e.py::_produce": SCHEDULE,
    "tests/transport/test_transport_e2e.py::_restart_mid_stream": SCHEDULE,
    "tests/transport/test_transport_e2e.py::"
    "test_acks_coalesce_per_interval_and_arrive_without_a_flush.body": SCHEDULE,
    "tests/transport/test_transport_e2e.py::test_many_agents_at_once_each_batch_exactly_once.body": SCHEDULE,
    "tests/transport/test_transport_e2e.py::"
    "test_new_streams_are_refused_while_the_event_loop_lags_and_let_in_after.block": HOLD,
    "tests/transport/test_transport_e2e.py::"
    "test_other_threads_read_the_streams_only_through_the_published_view.body": POLL,
    "tests/transport/test_transport_e2e.py::wait_until": POLL,
}


def _is_script(rel: str) -> bool:
    return rel.startswith(SCRIPT_DIRS) and not rel.rsplit("/", 1)[-1].startswith("test_")


def sleep_sites(source: str) -> list[tuple[str, int]]:
    """(function's dotted name, line) of each time.sleep / asyncio.sleep call in ``source``."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # a name the time or asyncio module is bound to -> which
    sleeps: dict[str, str] = {}  # a name their sleep is bound to -> whose
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name: a.name for a in node.names if a.name in ("time", "asyncio")}
        elif isinstance(node, ast.ImportFrom) and node.module in ("time", "asyncio"):
            sleeps |= {a.asname or a.name: node.module for a in node.names if a.name == "sleep"}
    found: list[tuple[str, int]] = []

    def whose(f: ast.expr) -> str | None:
        if isinstance(f, ast.Attribute) and f.attr == "sleep" and isinstance(f.value, ast.Name):
            return modules.get(f.value.id)
        return sleeps.get(f.id) if isinstance(f, ast.Name) else None

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, (*scope, child.name))
                continue
            if isinstance(child, ast.Call) and (module := whose(child.func)) is not None:
                first = child.args[0] if child.args else None
                yields = module == "asyncio" and isinstance(first, ast.Constant) and first.value == 0
                if not yields:
                    found.append((".".join(scope) or "<module>", child.lineno))
            visit(child, scope)

    visit(tree, ())
    return found


@pytest.fixture(scope="module")
def sites() -> dict[str, list[int]]:
    """``path::function`` -> the lines of its sleeps, over the tests."""
    out: dict[str, list[int]] = {}
    # the suite's test paths (pyproject's testpaths): tests/ and each collector's own tests/
    for path in sorted([*TESTS.rglob("*.py"), *(ROOT / "perfd" / "collectors").glob("*/tests/**/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if _is_script(rel):
            continue
        for func, line in sleep_sites(path.read_text()):
            out.setdefault(f"{rel}::{func}", []).append(line)
    return out


def test_no_test_sleeps_off_the_allow_list(sites: dict[str, list[int]]) -> None:
    new = [f"{key} (line {', '.join(map(str, lines))})" for key, lines in sites.items() if key not in ALLOWED]
    assert not new, ("sleeps in tests that are not on tests/test_no_sleep.py's allow-list:\n  "
                     + "\n  ".join(new) + "\nWhere the code reads a clock, move that clock (a simulated "
                     "or injected one) instead; where it waits for another thread or process, poll for the "
                     "state with a deadline (tests/procs.py wait_for). If the sleep must stay, add it with "
                     "its reason.")


def test_every_allowed_sleep_is_still_there(sites: dict[str, list[int]]) -> None:
    gone = sorted(set(ALLOWED) - set(sites))
    assert not gone, "no sleep left in these: take them off the allow-list\n  " + "\n  ".join(gone)


def test_the_scan_finds_each_spelling_and_nothing_else() -> None:
    source = '''
import asyncio
import time
import time as t
from asyncio import sleep as nap
from time import sleep


def plain():
    time.sleep(1)


class Rig:
    def wait(self):
        def inner():
            t.sleep(0.1)
        sleep(2)


async def co():
    await asyncio.sleep(0.5)
    await nap(1)
    await asyncio.sleep(0)  # a yield to the event loop
    await nap(0)  # the same
    time.sleep(0)  # counted: a sleep all the same
    clock.sleep(1)  # someone else's sleep
    code = "import time; time.sleep(5)"  # a child's code, a string here

time.sleep(3)
'''
    assert sleep_sites(source) == [("plain", 10), ("Rig.wait.inner", 16), ("Rig.wait", 17), ("co", 21),
                                   ("co", 22), ("co", 25), ("<module>", 29)]
