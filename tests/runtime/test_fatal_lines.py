"""jax.distributed's fatal reports become one line: the reports below are XLA's own text (jaxlib
0.10.2, captured from real runs of two and three processes), and the supervisor is run
for real in front of a host that aborts the way XLA's client does."""

import signal
import subprocess
import sys
import textwrap

from locojax.launch.fatal import Context, LineFilter, fatal_line

CTX = Context(process_id=0, num_processes=3, coordinator="localhost:62000", init_timeout_s=5,
              heartbeat_timeout_s=10)
HEADER = ("F1201 12:09:19.346942   23450 client.h:80] Terminating process because the JAX "
          "distributed service detected fatal errors. This most likely indicates that another "
          "task died; see the other task logs for more details. Disable Python buffering, i.e. "
          "`python -u`, to be sure to see all the previous output. absl::Status: ")
MISSING = HEADER + textwrap.dedent("""\
    DEADLINE_EXCEEDED: Barrier timed out. Id: [Init]Wait_for_all_tasks_to_register::0. This usually happens because a task triggered the barrier too early or too slowly. Please look at the task logs (both timed out and first task) to debug further.
    # of tasks that reached the barrier: 2/3.
    The first task at the barrier: 0. Some timed out task names:
    2


    RPC: /xla.coordination.CoordinationService/RegisterTask [type.googleapis.com/tensorflow.CoordinationServiceError='']
    *** Check failure stack trace: ***
        @     0x7f0184c40634  absl::lts_20260107::log_internal::LogMessage::SendToLog()
        @     0x7f0184c405b6  absl::lts_20260107::log_internal::LogMessage::Flush()
    """)  # noqa: E501
NO_COORDINATOR = HEADER + textwrap.dedent("""\
    DEADLINE_EXCEEDED: Deadline Exceeded

    RPC: /xla.coordination.CoordinationService/RegisterTask
    *** Check failure stack trace: ***
    """)
DEAD = HEADER + textwrap.dedent("""\
    UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):
    1
    The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug further.

    RPC: /xla.coordination.CoordinationService/PollForError [type.googleapis.com/tensorflow.CoordinationServiceError='']
    *** Check failure stack trace: ***
    """)  # noqa: E501
BEFORE = textwrap.dedent("""\
    E1201 12:08:15.876079   23133 coordination_service.cc:1549] [13107144517023486436] Use error polling to propagate the following error to all tasks: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):
    1
    The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug further. [type.googleapis.com/tensorflow.CoordinationServiceError='']
    E1201 12:08:15.876723   23144 coordination_service_agent.cc:289] Polled an error from coordination service (this can be an error from this or another task).
    """)  # noqa: E501


def test_each_report_is_one_line_naming_hosts_and_the_key():
    start = ("start the same command on every host (one task per host), or give them longer to "
             "start with controller.init_timeout_s")
    assert fatal_line(MISSING, CTX) == (
        f"error: 2 of 3 hosts joined within controller.init_timeout_s=5 (missing: host 2); "
        f"{start}")
    two = Context(1, 2, "localhost:62000", 5, 10)
    assert fatal_line(NO_COORDINATOR, two) == (
        "error: at most 1 of 2 hosts joined: host 0, the coordinator at localhost:62000, did "
        f"not answer within controller.init_timeout_s=5; {start}")
    assert fatal_line(DEAD, CTX) == (
        "error: host 1 stopped sending heartbeats for controller.heartbeat_timeout_s=10 (died, "
        "was killed or hangs): stopping host 0 too")
    assert fatal_line(HEADER + "INTERNAL: something else\n", CTX) == (
        "error: jax.distributed stopped host 0: INTERNAL: something else")


def _through(filt: LineFilter, text: str, now: float = 0.0) -> list[str]:
    return [out for line in text.splitlines(keepends=True) for out in filt.feed(line, now)]


def test_filter_passes_other_lines_and_drops_the_service_records_before_a_fatal_one():
    filt = LineFilter(CTX)
    assert _through(filt, "step 1/3\n") == ["step 1/3\n"]
    assert _through(filt, BEFORE) == []  # held: a fatal record may follow
    assert _through(filt, DEAD) == []
    assert filt.tick(0.5) == []  # its status is still settling
    assert filt.tick(5.0) == [fatal_line(DEAD, CTX) + "\n"]
    assert filt.close() == [""]


def test_a_report_that_ends_after_its_line_was_printed_stays_one_line():
    """Seen under load on main: the stack trace came more than SETTLE_S after the record."""
    filt = LineFilter(CTX)
    record, trace = MISSING.split("*** Check failure stack trace: ***")
    assert _through(filt, record) == []
    assert filt.tick(5.0) == [fatal_line(MISSING, CTX) + "\n"]
    assert _through(filt, "*** Check failure stack trace: ***" + trace, 9.0) == []
    assert filt.tick(20.0) == [] and filt.close() == [""] and filt.code == 2


def test_filter_releases_held_records_when_no_fatal_one_follows():
    filt = LineFilter(CTX)
    assert _through(filt, BEFORE) == []
    assert filt.tick(1.0) == []
    assert "".join(filt.tick(3.0)) == BEFORE
    assert _through(filt, "next\n", 3.1) == ["next\n"]


def _supervised(body: str) -> subprocess.CompletedProcess:
    """`body` run as the host behind `supervise` (the fork `join` does before joining)."""
    code = textwrap.dedent("""
        import os, signal, sys
        from locojax.launch.fatal import Context, supervise
        supervise(Context(0, 3, "localhost:62000", 5, 10))
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)


def test_supervisor_turns_an_abort_into_one_line_and_the_lines_exit_code():
    """The host writes XLA's report straight to fd 2 and aborts, as XLA's client does."""
    for report, code in ((MISSING, 2), (DEAD, 1)):
        out = _supervised(f"""
            print("a line of the run", file=sys.stderr, flush=True)
            os.write(2, {(BEFORE + report).encode()!r})
            os.abort()
        """)
        assert out.returncode == code, out.stderr
        assert out.stderr.splitlines() == ["a line of the run", fatal_line(report, CTX)]


def test_supervisor_exits_as_its_host_and_passes_signals_on():
    out = _supervised("print('out', flush=True); sys.exit(3)")
    assert (out.returncode, out.stdout, out.stderr) == (3, "out\n", "")
    out = _supervised("os.kill(os.getpid(), signal.SIGKILL)")
    assert out.returncode == -signal.SIGKILL
    out = _supervised("""
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
        os.kill(os.getppid(), signal.SIGTERM)  # to the supervisor, which passes it on
        signal.pause()
    """)
    assert out.returncode == 7, out.stderr
