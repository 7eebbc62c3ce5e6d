"""`make mutate`: mutation testing of the contract-critical modules with cosmic-ray.

This file holds the scope table (which module, which functions of it, which tests) and does
only what cosmic-ray has no setting for; the rest is cosmic-ray's own:

- which operators run: its operators-filter (`exclude-operators`, EXCLUDED_OPERATORS below);
- a mutant judged equivalent: `# pragma: no mutate (why)` on its line (its pragma filter skips
  every mutant of the line);
- the scoped functions: its line-filter, with the line ranges this file reads off the module
  (`@dataclass(...)` lines left out: nothing assigns to those records, mypy enforces `frozen`);
- running each mutant's test command with a timeout (a mutant that hangs counts as killed).

What cosmic-ray cannot do and this file does: run each module against its own test selection
(one cosmic-ray session per scope), in a copy of the tree (mutants are written there, never into
the work tree; PYTHONPATH puts the copy before the editable install), within a budget per module
(what is left is reported as not run); explain the survivors listed in mutation/equivalent.toml
(a mutant on a line whose other mutants the tests kill, which a pragma would skip too, and the
known gaps); and exit 1 when a survivor is not explained.

    make mutate                                   # every module (hours on 2 cores)
    make mutate MUTATE_ARGS="--module cleanup/fence.py --budget-s 900"
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXPLAINED = Path(__file__).resolve().parent / "equivalent.toml"

# Left out (cosmic-ray's operators-filter, regular expressions matched at the start): arithmetic
# swaps other than `+`/`-` (they mostly mangle message strings and paths: thousands of mutants
# that only crash), comparisons turned into unrelated ones (`==` to `<`, `<` to `is`), unary
# operators, removed decorators and variable swaps. What runs: comparisons to their negation or
# boundary, `and`/`or`, `not`, `True`/`False`, numbers, `break`/`continue`, exception handlers,
# loops run zero times, `+`/`-`.
KEPT_COMPARISONS = "|".join(
    (
        *("Eq_NotEq", "NotEq_Eq", "Lt_GtE", "GtE_Lt", "Gt_LtE", "LtE_Gt"),
        *("Lt_LtE", "LtE_Lt", "Gt_GtE", "GtE_Gt", "Is_IsNot", "IsNot_Is"),
    )
)
EXCLUDED_OPERATORS = [
    "core/ReplaceBinaryOperator_(?!(Add_Sub|Sub_Add)$)",
    f"core/ReplaceComparisonOperator_(?!({KEPT_COMPARISONS})$)",
    "core/ReplaceUnaryOperator_",
    "core/RemoveDecorator$",
    "core/VariableReplacer$",
    "core/VariableInserter$",
]

CLEANUP_TESTS = ["tests/cleanup/test_guards.py", "tests/cleanup/test_service.py"]
SMALLFILE_TESTS = [
    f"tests/system/test_smallfile.py::test_{name}"
    for name in (
        "what_is_not_a_small_regular_file_is_refused",
        "an_admin_file_that_is_not_a_plain_small_file_is_unreadable",
        "markers_that_are_fifos_are_no_markers_and_never_waited_on",
        "a_commondir_that_is_a_fifo_is_no_common_dir",
        "read_head_follows_a_symlink_to_a_regular_file_and_refuses_one_to_a_fifo",
        "an_admin_file_unreadable_for_a_reason_is_logged_and_a_missing_one_is_not",
        "a_relative_gitdir_is_resolved_from_the_checkout",
    )
]

# One test per contract rule that another test guarded only in passing (real daemons, git,
# sockets; a few seconds each): each is in the scope of the module its rule lives in.
CONTRACT_RULES = "tests/architecture/test_contract_rules.py"


@dataclass(frozen=True)
class Scope:
    module: str
    tests: list[str]
    functions: list[str] = field(default_factory=list)
    """Only these functions (and methods) are mutated; empty: the whole module."""
    timeout_s: float = 180.0
    """One mutant's test run; beyond it, the mutant counts as killed (the tests hung)."""


SCOPES = [
    Scope("daemon/xumd/cleanup/fence.py", CLEANUP_TESTS),
    Scope("daemon/xumd/cleanup/steps.py", CLEANUP_TESTS),
    Scope("daemon/xumd/cleanup/runner.py", [*CLEANUP_TESTS, "tests/cleanup/test_schedule.py"]),
    # The obligations' due times (a step made due, a failed or cut-short attempt, a write that
    # lost to another, later steps deferred and released, the next due time) and what the
    # start-up pass reads and writes (a clock step, old rows, the trash entries still named): on
    # a real store, in-process, about a second; the service's tests use the same calls.
    Scope(
        "daemon/xumd/cleanup/obligations.py",
        ["tests/cleanup/test_obligations_inprocess.py", "tests/cleanup/test_schedule.py"],
        functions=[
            "bound_error",
            "due_now",
            "_update",
            "fail_attempt",
            "cut_short",
            "make_due",
            "defer_later_steps",
            "release_later_steps",
            "release_blocked_siblings",
            "blocking_teardown",
            "defer",
            "due_workspaces",
            "next_due",
            "clamp_future",
            "shift_pending",
            "purge_finished",
            "referenced_trash_paths",
            "unfinished_paths",
        ],
    ),
    Scope(
        "daemon/xumd/lifecycle/coordinator.py",
        ["tests/lifecycle/test_coordinator.py", "tests/lifecycle/test_rename_settle.py"],
    ),
    # The directory exclusion, moved out of coordinator.py: the same contract, its own module.
    Scope("daemon/xumd/checkouts/exclusion.py", ["tests/lifecycle/test_coordinator.py"]),
    Scope(
        "daemon/xumd/processes/quiescence.py",
        [
            "tests/processes/test_quiescence.py",
            "tests/architecture/test_contract_deadlines.py::test_a_probe_that_does_not_finish_means_busy",
            "tests/architecture/test_contract_deadlines.py::test_a_probe_in_time_names_the_process",
        ],
    ),
    # In-process (a real store, git and directories; no daemon): every decision of the pass in
    # seconds. The daemon-level tests (test_recovery.py, the crash matrix) take minutes a mutant.
    # The restore's roll-forward decision is pinned a second time by a real crash (about 2 s).
    Scope(
        "daemon/xumd/recovery/reconcile.py",
        [
            "tests/recovery/test_reconcile_inprocess.py",
            f"{CONTRACT_RULES}::"
            "test_at_start_up_a_restore_rolls_forward_only_once_its_checkout_was_recorded",
        ],
    ),
    # In-process (real git repositories, no daemon): seconds per mutant where the archive and
    # unarchive daemon tests took minutes; the rules those tests pinned are pinned here too.
    Scope(
        "daemon/xumd/lifecycle/snapshot.py",
        [
            "tests/lifecycle/test_snapshot_inprocess.py",
            # The lstat walk (a symlinked directory is one entry), in-process too.
            "tests/lifecycle/test_preserved_files.py::"
            "test_an_ignored_symlink_to_a_directory_is_one_entry_never_walked_into",
            # The clean-checkout fold (`_head`, `_clean`), in-process.
            "tests/lifecycle/test_remove_fewer_git_calls.py::test_a_clean_checkout_is_heads_tree_without_writing_trees",
            "tests/lifecycle/test_remove_fewer_git_calls.py::test_each_kind_of_work_is_dirty_as_before",
            "tests/lifecycle/test_remove_fewer_git_calls.py::"
            "test_configuration_that_hides_work_from_status_does_not_hide_it_here",
            "tests/lifecycle/test_remove_fewer_git_calls.py::"
            "test_a_submodule_moved_under_an_ignore_setting_is_captured_as_before",
            "tests/lifecycle/test_remove_fewer_git_calls.py::test_skip_worktree_entries_take_the_full_path",
            "tests/lifecycle/test_remove_fewer_git_calls.py::test_an_unborn_head_fails_as_before",
            "tests/lifecycle/test_remove_fewer_git_calls.py::test_only_a_clean_version_2_index_is_judged_clean_by_status",
        ],
    ),
    Scope(
        "daemon/xumd/system/rootlock.py",
        [
            "tests/daemon/test_rootlock_release.py",
            "tests/daemon/test_basics.py::test_second_daemon_refused_naming_the_first",
            "tests/daemon/test_basics.py::test_restart_after_sigkill",
            # The holder's start as psutil gives it (procstat.kernel_create_time).
            "tests/daemon/test_lean_start.py::test_the_lock_files_start_time_is_psutils",
        ],
    ),
    # Liveness by identity (pid and start time), moved out of procutil.py. In-process (real
    # children, zombies, a real time namespace; no daemon): about a second of tests a mutant,
    # where test_identity.py's daemon restarts and test_lease.py took ~50 s.
    Scope(
        "daemon/xumd/system/procstat.py",
        [
            "tests/system/test_procstat.py",
            *(
                f"tests/processes/test_identity.py::test_{name}"
                for name in (
                    "boot_anchor_is_kept_for_this_boot_and_renewed_after_a_reboot",
                    "a_start_time_recorded_before_the_anchor_still_reads",
                    "a_stat_read_that_fails_is_gone_only_when_the_process_is",
                )
            ),
            # kill_tree over tree_identities (a member's parent and start time from one read);
            # tree_identities' own tests are in test_procstat.py.
            "tests/system/test_procutil.py::"
            "test_a_member_whose_pid_is_reused_while_the_tree_is_read_is_not_a_member",
        ],
    ),
    # The Linux backend's reader of /proc/PID/stat and of the boot clock, under procstat's
    # identity: procstat's tests.
    Scope(
        "daemon/xumd/system/platform/linux.py",
        [
            "tests/system/test_procstat.py",
            "tests/processes/test_identity.py::"
            "test_a_stat_read_that_fails_is_gone_only_when_the_process_is",
        ],
        functions=[
            "boot_id",
            "kernel_boot_time",
            "timens_boottime_offset",
            "since_boot",
            "stat_fields",
            "_ticks_since_boot",
            "start_since_boot",
            "kernel_create_time",
            "tree_since_boot",
        ],
    ),
    # Who listens on a busy port, as the Linux backend reads it (/proc/net/tcp, then the
    # descriptor tables of the socket owners' processes): real listeners in real processes,
    # another user's, a forking server's; faults of one system call. Its own scope: the
    # procstat selection above has nothing to say about sockets.
    Scope(
        "daemon/xumd/system/platform/linux.py",
        ["tests/system/test_port_listeners.py", "tests/system/test_listeners_linux.py"],
        functions=["listeners", "_socket_inodes", "owned_by"],
    ),
    Scope(
        "daemon/xumd/system/procutil.py",
        [
            "tests/system/test_procutil.py",
            # run_command's start through xumd.system.childproc: group or session, big stdin, fds.
            "tests/system/test_childproc.py",
            "tests/processes/test_lease.py::test_script_lease_covers_a_run_command",
            *(
                f"tests/system/test_containment.py::test_{name}"
                for name in (
                    "run_command_stops_a_double_fork_without_a_subreaper",
                    "a_timed_out_command_takes_its_double_fork_with_it",
                    "leftovers_that_cannot_be_looked_for_fail_the_script",
                    "a_process_that_cannot_be_pinned_is_not_reported_stopped",
                    "a_cancellation_while_the_child_starts_still_kills_it",
                    "git_hook_double_fork_is_stopped_after_the_command",
                    "teardown_escapee_that_cannot_be_stopped_fails_the_step_naming_it",
                    # A real daemon (about 5 s), the one run_command test of a run's cgroup.
                    "cgroup_contains_a_teardown_child_that_drops_its_environment",
                )
            ),
        ],
        functions=["run_command", "kill_tree", "_any_alive", "_read_into", "_feed_stdin"],
    ),
    # The narrow branch-name rule that spares create a `check-ref-format`: its test
    # checks every listed name against git itself, in-process (no daemon).
    Scope(
        "daemon/xumd/lifecycle/create.py",
        [
            "tests/lifecycle/test_create_fewer_git_calls.py::test_the_plain_rule_accepts_only_what_git_accepts"
        ],
        functions=["plain_branch_name"],
    ),
    # The state a removal began from: recorded in the intent's transaction and read back by
    # recovery. In-process (a real store and directories, no daemon).
    Scope(
        "daemon/xumd/lifecycle/rows.py",
        [
            *(
                f"tests/recovery/test_reconcile_inprocess.py::test_{name}"
                for name in (
                    "removing_rows_roll_back_to_where_they_came_from",
                    "a_flagged_row_goes_back_to_the_state_its_removal_began_from",
                    "a_failed_removal_of_a_flagged_archived_row_leaves_it_archived",
                )
            ),
        ],
        functions=["record_removal_prior", "removal_prior_state"],
    ),
    # The spawn path under run_command: real children, pipes, pidfds, groups and
    # sessions, in-process; run_command's own tests reach every branch of it.
    Scope(
        "daemon/xumd/system/childproc.py",
        ["tests/system/test_childproc.py", "tests/system/test_procutil.py"],
    ),
    # The never-blocking reader of small files someone else may replace (FIFOs, devices, huge
    # files) and git's admin files read through it: in-process, real FIFOs and files.
    Scope("daemon/xumd/system/smallfile.py", SMALLFILE_TESTS),
    Scope("daemon/xumd/checkouts/adminfile.py", SMALLFILE_TESTS),
    # The incarnation markers: read and written in-process here, and by the fence's checks.
    Scope("daemon/xumd/checkouts/marker.py", [*SMALLFILE_TESTS, "tests/cleanup/test_guards.py"]),
    # The proof that nothing is lost, on the bytes, and the raw copy it saves and places: the
    # module tests (a real permission as another user, sha256, deep paths), then the real
    # daemon's class tests (nested repositories, flags, filters, submodules, detached HEADs).
    Scope(
        "daemon/xumd/lifecycle/onbytes.py",
        ["tests/lifecycle/test_onbytes.py", "tests/lifecycle/test_nothing_lost_on_bytes.py"],
    ),
    Scope(
        "daemon/xumd/system/rawcopy.py",
        ["tests/lifecycle/test_onbytes.py", "tests/lifecycle/test_nothing_lost_on_bytes.py"],
    ),
    # The one atomic write (the markers, the boot anchor, the hosts file): real files, a full
    # tmpfs, a failing fsync, in-process.
    Scope("daemon/xumd/system/atomicfile.py", ["tests/system/test_atomicfile.py"]),
    # The one tree walk by descriptor (deletion, copies, usage, the proof): real trees past
    # PATH_MAX and its descriptor window, swaps, a moved ancestor, special files, an unreadable
    # directory, mounts; then its callers' module tests, in-process.
    Scope(
        "daemon/xumd/system/walk.py",
        [
            "tests/system/test_walk.py",
            # The errors a walk names (a file it may not delete or read, a parent it cannot
            # enter), in-process; the file's daemon test takes a daemon a mutant.
            *(
                f"tests/system/test_walk_errors.py::test_{name}"
                for name in (
                    "delete_tree_names_the_file_it_may_not_delete",
                    "delete_tree_as_an_ordinary_user_names_another_user_s_file",
                    "a_copy_names_the_file_or_directory_it_cannot_read",
                    "opening_an_entry_s_parents_names_the_directory_it_cannot_enter",
                )
            ),
            "tests/system/test_fsdelete.py",
            "tests/system/test_fscopy.py",
            "tests/system/test_fscopy_mounts.py",
        ],
    ),
    # The strays count's claims, a chunk of a directory's checkouts at a time (a row, an
    # unfinished step, a link to a claimed path): in-process, a real store and directories.
    Scope(
        "daemon/xumd/recovery/strays.py",
        ["tests/recovery/test_strays_claims.py"],
        functions=["unclaimed", "_every_claimed_real", "_few_claimed"],
    ),
    # The copy primitive (archive store, preserved and ignored files): in-process tests of the
    # copy itself, its callers' plans (seed) and the snapshot's use of it; real FIFOs, holes,
    # mounts, a full filesystem. The daemon tests of test_ignored_copy.py take minutes a mutant.
    Scope(
        "daemon/xumd/system/fscopy.py",
        [
            "tests/system/test_fscopy.py",
            "tests/system/test_fscopy_mounts.py",
            "tests/lifecycle/test_snapshot_inprocess.py",
            *(
                f"tests/lifecycle/test_ignored_copy.py::test_{name}"
                for name in (
                    "a_symlink_on_the_way_to_an_entry_is_refused",
                    "an_entry_deleted_from_the_main_checkout_after_sizing_is_skipped",
                    "an_entry_the_new_checkout_has_already_does_not_count_against_the_cap",
                    "a_disk_that_fills_up_mid_copy_is_disk_full_and_the_partial_entry_is_removed",
                    "a_shutdown_mid_copy_stops_it_at_the_next_file_and_removes_the_partial_entry",
                    "a_shutdown_during_one_large_file_stops_between_its_chunks",
                    "entries_past_the_cap_are_not_walked",
                )
            ),
        ],
    ),
    # The contract rules of tests/architecture/test_contract_rules.py, each beside the module's own
    # tests. Stale git locks: a git working in a linked worktree (a `.git` file, `commondir`) keeps
    # its lock; the in-process and daemon tests of the sweep.
    Scope(
        "daemon/xumd/system/gitlocks.py",
        [
            "tests/lifecycle/test_gitlocks.py",
            f"{CONTRACT_RULES}::"
            "test_a_git_working_in_a_linked_worktree_keeps_its_lock_when_another_workspace_is_made",
        ],
    ),
    # What a lingering archived checkout holds that its archive does not: the comparison both
    # the cleanup's trash step (cleanup.retry) and unarchive make, preserved files included.
    Scope(
        "daemon/xumd/lifecycle/unarchive.py",
        [
            f"{CONTRACT_RULES}::"
            "test_cleanup_retry_never_trashes_an_archived_checkout_whose_preserved_file_changed",
            "tests/lifecycle/test_preserved_files.py::"
            "test_unarchive_refuses_to_trash_a_lingering_checkout_whose_preserved_file_changed",
            "tests/cleanup/test_lingering_work.py",
        ],
        functions=[
            "unsaved_in_checkout",
            "_unsaved_preserved",
            "unsaved_before_trash",
            "unsaved_in_lingering",
            "_refuse_unsaved",
        ],
    ),
    # remove: its refusals, and with force the snapshot taken before the checkout goes.
    Scope(
        "daemon/xumd/lifecycle/remove.py",
        [
            f"{CONTRACT_RULES}::test_remove_with_force_snapshots_the_work_before_the_checkout_goes",
            *(
                f"tests/lifecycle/test_archive.py::test_{name}"
                for name in (
                    "remove_clean_workspace",
                    "remove_dirty_is_not_safe_then_force_snapshots",
                    "remove_archived_workspace_keeps_refs",
                    "remove_with_work_held_by_snapshot_is_safe",
                )
            ),
        ],
    ),
    # Binding the socket: a live listener on the path is refused, a stale socket file replaced
    # (a restart after SIGKILL leaves one).
    Scope(
        "daemon/xumd/rpc/server.py",
        [
            f"{CONTRACT_RULES}::"
            "test_a_live_listener_on_the_socket_path_is_never_unlinked_and_the_daemon_does_not_start",
            "tests/daemon/test_systemd.py::test_a_foreign_listener_on_the_socket_path_is_not_stolen",
            "tests/daemon/test_basics.py::test_restart_after_sigkill",
        ],
        functions=["bind_socket", "_has_listener"],
    ),
    # gc's plan: a row the start-up pass flagged is skipped by both policies that collect
    # workspaces; the policies' own tests show an unflagged row is still collected.
    Scope(
        "daemon/xumd/gc/plan.py",
        [
            f"{CONTRACT_RULES}::test_gc_leaves_the_workspaces_the_start_up_pass_flagged",
            "tests/gc/test_gc.py::test_archived_workspaces_removed_after_n_days",
            "tests/gc/test_gc.py::test_archive_merged_clean_only",
        ],
        functions=["_archived", "_merged", "unclean", "_add_workspace", "_interrupted"],
    ),
]


@dataclass
class ModuleReport:
    module: str
    total: int = 0
    skipped: int = 0
    killed: int = 0
    timed_out: int = 0
    explained: int = 0
    """Survivors explained in equivalent.toml."""
    survived: int = 0
    """Survivors that are not."""
    not_run: int = 0


def _copy_tree(dest: Path) -> None:
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        rel = raw.decode()
        src = REPO / rel
        if not src.is_file() or rel.startswith(("mutation/", "bench/")):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def _function_lines(tree: ast.Module, names: list[str]) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in names:
            lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            found.setdefault(node.name, set()).update(lines)
    return found


def line_ranges(scope: Scope, source: str) -> list[str]:
    """The line-filter's ranges: the scoped functions (or the whole module), without the
    `@dataclass(...)` lines."""
    lines = source.splitlines()
    if scope.functions:
        keep = set().union(*_function_lines(ast.parse(source), scope.functions).values())
    else:
        keep = set(range(1, len(lines) + 1))
    keep -= {n for n, text in enumerate(lines, 1) if text.strip().startswith("@dataclass(")}
    ranges: list[str] = []
    start = previous = None
    for n in [*sorted(keep), None]:
        if start is not None and n != previous + 1:  # type: ignore[operator]
            ranges.append(f"{start}-{previous}")
            start = None
        if start is None:
            start = n
        previous = n
    return ranges


def config(scope: Scope, python: str, source: str) -> str:
    tests = " ".join(scope.tests)
    # Without hypothesis' pytest plugin (no scoped selection uses it): importing it is half
    # of each mutant's collection time on these cores, paid once per mutant.
    command = (
        f"{python} -m pytest -x -q -p no:cacheprovider -p no:hypothesispytest -o addopts="
        " -m 'not reliability'"
        f" --timeout={int(scope.timeout_s)} {tests}"
    )
    # JSON string and list syntax is TOML's (for this ASCII text).
    return (
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(scope.module)}\n"
        f"timeout = {scope.timeout_s}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(command)}\n"
        "\n[cosmic-ray.distributor]\nname = 'local'\n"
        "\n[cosmic-ray.filters.operators-filter]\n"
        f"exclude-operators = {json.dumps(EXCLUDED_OPERATORS)}\n"
        "\n[cosmic-ray.filters.line-filter.lines]\n"
        f"{json.dumps(scope.module)} = {json.dumps(line_ranges(scope, source))}\n"
    )


def equivalent_entries() -> list[dict[str, str]]:
    entries: list[dict[str, str]] = tomllib.loads(EXPLAINED.read_text())["survivor"]
    return entries


def _same(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


def problems() -> list[str]:
    """What makes the scope table or equivalent.toml name something that is not there: a
    module, test file or function that moved, an entry whose line changed (it would explain
    nothing, and its mutant would be reported as a survivor)."""
    found: list[str] = []
    modules = {s.module for s in SCOPES}
    for s in SCOPES:
        for path in [s.module, *(t.split("::")[0] for t in s.tests)]:
            if not (REPO / path).exists():
                found.append(f"{s.module}: no such path {path}")
        if s.functions and (REPO / s.module).exists():
            tree = ast.parse((REPO / s.module).read_text())
            missing = set(s.functions) - set(_function_lines(tree, s.functions))
            found += [f"{s.module}: no function {name}" for name in sorted(missing)]
    for entry in equivalent_entries():
        file = REPO / entry["module"]
        if entry["module"] not in modules or not file.exists():
            found.append(f"equivalent.toml: {entry['module']} is not in the scope")
        elif not any(_same(line, entry["line"]) for line in file.read_text().splitlines()):
            found.append(f"equivalent.toml: {entry['module']} has no line {entry['line']!r}")
    return found


def _explain(entries: list[dict[str, str]], operator: str, line: str, previous: str) -> str:
    for e in entries:
        if (
            e["operator"] == operator
            and _same(e["line"], line)
            and ("after" not in e or _same(e["after"], previous))
        ):
            return f"{'known gap' if e.get('status') == 'gap' else 'equivalent'}: {e['why']}"
    return ""


def run_module(
    scope: Scope, *, python: str, budget_s: float, keep_dir: bool, count_only: bool = False
) -> ModuleReport:
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    report = ModuleReport(scope.module)
    work = Path(tempfile.mkdtemp(prefix="xum-mutate-"))
    bin_dir = Path(sys.executable).parent
    try:
        src = work / "src"
        _copy_tree(src)
        source = (src / scope.module).read_text()
        cfg, session = work / "cr.toml", work / "session.sqlite"
        cfg.write_text(config(scope, python, source))
        for argv in (
            ["cosmic-ray", "init", str(cfg), str(session)],
            ["cr-filter-operators", str(session), str(cfg)],
            ["cr-filter-pragma", str(session)],
            ["cr-filter-lines", str(session), "--config", str(cfg)],
        ):
            subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=src, check=True)
        with use_db(str(session)) as db:
            report.total = db.num_work_items
            report.skipped = db.num_results
        print(
            f"== {scope.module}: {report.total - report.skipped} mutants"
            f" ({report.skipped} skipped by the filters),"
            f" budget {budget_s:.0f}s",
            flush=True,
        )
        if count_only:
            return report
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(str(src / p) for p in ("daemon", "protocol", "clients")),
        }
        proc = subprocess.Popen(
            [str(bin_dir / "cosmic-ray"), "exec", str(cfg), str(session)],
            cwd=src,
            env=env,
            start_new_session=True,
        )
        try:
            proc.wait(budget_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            print(f"   budget of {budget_s:.0f}s spent: the rest is not run", flush=True)
        lines = source.splitlines()
        entries = [e for e in equivalent_entries() if e["module"] == scope.module]
        with use_db(str(session)) as db:
            for item, result in db.completed_work_items:
                if result.worker_outcome == WorkerOutcome.SKIPPED:
                    continue
                if result.test_outcome != TestOutcome.SURVIVED:
                    report.killed += 1
                    report.timed_out += result.worker_outcome == WorkerOutcome.ABNORMAL
                    continue
                (mutation,) = item.mutations
                n = mutation.start_pos[0]
                why = _explain(entries, mutation.operator_name, lines[n - 1], lines[n - 2])
                print(f"  {scope.module}:{n} {mutation.operator_name}: {lines[n - 1].strip()}")
                if why:
                    report.explained += 1
                    print(f"    {why}")
                else:
                    report.survived += 1
                    print(
                        "    UNEXPLAINED\n    "
                        + (result.diff or "").strip().replace("\n", "\n    ")
                    )
            report.not_run = len(list(db.pending_work_items))
    finally:
        if keep_dir:
            print(f"   session kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--module",
        action="append",
        default=[],
        help="a scoped module (suffix match, e.g. cleanup/fence.py); repeatable; default: all",
    )
    parser.add_argument("--budget-s", type=float, default=3600.0, help="per module")
    parser.add_argument("--python", default=str(REPO / ".venv" / "bin" / "python"))
    parser.add_argument("--keep", action="store_true", help="keep each session directory")
    parser.add_argument("--list", action="store_true", help="print the scope and exit")
    parser.add_argument(
        "--count", action="store_true", help="print each module's mutant count and exit"
    )
    args = parser.parse_args()
    scopes = [
        s for s in SCOPES if not args.module or any(s.module.endswith(m) for m in args.module)
    ]
    if not scopes:
        parser.error(f"no scoped module matches {args.module}")
    if found := problems():
        parser.error("; ".join(found))
    if args.list:
        for s in scopes:
            only = f" (functions: {', '.join(s.functions)})" if s.functions else ""
            print(f"{s.module}{only}: {' '.join(s.tests)}")
        return 0
    started = time.monotonic()
    reports = [
        run_module(
            s, python=args.python, budget_s=args.budget_s, keep_dir=args.keep, count_only=args.count
        )
        for s in scopes
    ]
    if args.count:
        return 0
    print("\n== mutation score (killed / run; a timeout counts as killed)")
    for r in reports:
        ran = r.killed + r.explained + r.survived
        score = f"{100 * r.killed / ran:.1f}%" if ran else "n/a"
        print(
            f"{r.module}: {score}  killed {r.killed} (timeouts {r.timed_out}),"
            f" survived {r.explained + r.survived} ({r.survived} unexplained), not run"
            f" {r.not_run}, skipped {r.skipped}"
        )
    survivors = sum(r.survived for r in reports)
    print(
        f"\nunexplained survivors: {survivors} (each needs a test, a pragma or an entry); took"
        f" {time.monotonic() - started:.0f}s"
    )
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
