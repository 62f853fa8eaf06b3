"""The `cogency profile` commands as a user runs them: why each entry is believed, history,
corrections, export, import, forget's receipt, and what waits to be learned."""

from __future__ import annotations

import json
import sqlite3

import pytest

from cli_run import Cli


@pytest.fixture
def cli(tmp_path, db_path):
    return Cli(tmp_path, db_path)


def rows(db_path, sql, *params):
    connection = sqlite3.connect(db_path)
    try:
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()


LLM = "memory_models:agent"


def test_why_history_corrections_export_import_and_forget(cli, db_path, tmp_path):
    for query in ("remember: ship v2", "remember: learn \x1b[2Jrust\u202e"):
        done = cli("run", query, "--user", "alice", llm=LLM, memory=True)
        assert done.returncode == 0, done.stderr

    why = cli("profile", "show", "alice", "--why")
    assert why.returncode == 0, why.stderr
    out = why.stdout
    assert "'alice': 2 entries" in out
    assert "goals: ship v2  [learned" in out and "by scripted, 1 source]" in out
    assert "user: \u201cremember: ship v2\u201d" in out  # the message it was learned from
    (task,) = rows(db_path, "SELECT task_id FROM conversation_messages WHERE content = ?",
                   "remember: ship v2")[0:1]
    assert f"task {task[0]}" in out
    day = rows(db_path, "SELECT substr(created_at, 1, 10) FROM profile_entries LIMIT 1")[0][0]
    assert day in out
    # what came from the model and the user is escaped as the CLI escapes it
    assert "\x1b" not in out and "\u202e" not in out
    assert "learn \\x1b[2Jrust\\u202e" in out

    ship = rows(db_path, "SELECT entry_id FROM profile_entries WHERE value = 'ship v2'")[0][0]
    changed = cli("profile", "set", "goals", "ship v3", "--replaces", ship, "--user", "alice")
    assert changed.returncode == 0, changed.stderr
    assert "set goals: ship v3" in changed.stdout
    added = cli("profile", "set", "preferences.language", "Rust", "--user", "alice")
    assert "set preferences.language: Rust" in added.stdout
    rust = rows(db_path, "SELECT entry_id, origin FROM profile_entries WHERE value = 'Rust'")
    assert rust[0][1] == "user"
    removed = cli("profile", "remove", rust[0][0], "--user", "alice")
    assert removed.returncode == 0 and "removed preferences.language: Rust" in removed.stdout
    history = cli("profile", "history", "alice")
    assert "goals: ship v2  (changed by " in history.stdout
    assert "preferences.language: Rust  (removed: you removed it" in history.stdout
    shown = json.loads(cli("profile", "show", "alice").stdout)
    assert shown["goals"][-1] == "ship v3" and shown["preferences"] == {}

    bad = cli("profile", "set", "secrets", "x", "--user", "alice")
    assert bad.returncode == 1 and bad.stderr.startswith("error: field must be one of")
    missing = cli("profile", "remove", "nope", "--user", "alice")
    assert missing.returncode == 1 and "no current profile entry 'nope'" in missing.stderr

    export = tmp_path / "alice.json"
    done = cli("profile", "export", "alice", "--output", str(export))
    assert done.returncode == 0, done.stderr
    document = json.loads(export.read_text())
    assert document["format"] == "cogency.user/1" and len(document["conversations"]) == 2

    counted = {
        "entries": "SELECT COUNT(*) FROM profile_entries WHERE superseded_at IS NULL",
        "history": "SELECT COUNT(*) FROM profile_entries WHERE superseded_at IS NOT NULL",
        "messages": "SELECT COUNT(*) FROM conversation_messages",
    }
    before = {kind: rows(db_path, sql)[0][0] for kind, sql in counted.items()}
    forgot = cli("profile", "forget", "alice", "--yes")
    assert forgot.returncode == 0, forgot.stderr
    assert (f"1 profile, {before['entries']} profile entries, {before['history']} history "
            f"entries, 2 conversations, {before['messages']} messages, 0 unfinished tasks, "
            "0 approvals, 0 tasks queued for learning" in forgot.stdout)
    assert "(generation 1)" in forgot.stdout
    assert rows(db_path, "SELECT COUNT(*) FROM profile_entries") == [(0,)]

    restored = cli("profile", "import", str(export))
    assert restored.returncode == 0, restored.stderr
    assert "imported 1 profile" in restored.stdout
    assert json.loads(cli("profile", "show", "alice").stdout)["goals"] == shown["goals"]
    again = cli("profile", "import", str(export))
    assert again.returncode == 1 and "already holds data of this user" in again.stderr
    (tmp_path / "junk.json").write_text("{not json")
    junk = cli("profile", "import", str(tmp_path / "junk.json"))
    assert junk.returncode == 1 and "is not a JSON document" in junk.stderr


def test_profile_show_says_what_waits_to_be_learned_and_what_failed(cli):
    done = cli("run", "remember: ship v2", "--user", "alice", llm=LLM, memory=True,
               COGENCY_TEST_FAIL_LEARNING="1")
    assert done.returncode == 0 and "noted: remember: ship v2" in done.stdout
    assert "provider down" in done.stderr  # the failure is said where it happens
    shown = cli("profile", "show", "alice")
    assert shown.returncode == 0
    assert json.loads(shown.stdout)["interaction_count"] == 0  # stdout stays JSON
    assert ("note: 1 finished task waits to be learned; 1 attempt failed, the last with "
            "RuntimeError: provider down; next try at" in shown.stderr)
    why = cli("profile", "show", "alice", "--why")
    assert "learning: 1 finished task waits to be learned" in why.stdout

    # the next run, with the provider back, learns both
    later = cli("run", "remember: learn rust", "--user", "alice", llm=LLM, memory=True)
    assert later.returncode == 0, later.stderr
    shown = cli("profile", "show", "alice")
    assert json.loads(shown.stdout)["goals"] == ["ship v2", "learn rust"]
    assert shown.stderr == ""
