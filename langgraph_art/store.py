"""The trajectory store: one SQLite file per project, WAL mode, one transaction per finished run.

A killed process loses at most the runs still in flight: every trajectory is committed as soon as it ends.
Export to JSONL (stdlib) or Parquet (needs ``pyarrow``: ``pip install 'langgraph-art[export]'``).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from langgraph_art.config import check_name
from langgraph_art.errors import ConfigError
from langgraph_art.types import Trajectory, TrajectoryGroup

_SCHEMA = """
CREATE TABLE IF NOT EXISTS trajectories (
    id TEXT PRIMARY KEY,
    group_id TEXT,
    scenario_id TEXT,
    step INTEGER,
    status TEXT NOT NULL,
    reward REAL,
    created REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS trajectories_step ON trajectories(step);
CREATE INDEX IF NOT EXISTS trajectories_group ON trajectories(group_id);
CREATE INDEX IF NOT EXISTS trajectories_scenario ON trajectories(scenario_id);
CREATE TABLE IF NOT EXISTS trajectory_nodes (
    trajectory_id TEXT NOT NULL,
    node TEXT NOT NULL,
    PRIMARY KEY (trajectory_id, node)
);
CREATE INDEX IF NOT EXISTS trajectory_nodes_node ON trajectory_nodes(node);
CREATE TABLE IF NOT EXISTS groups (
    id TEXT PRIMARY KEY,
    scenario_id TEXT,
    step INTEGER,
    created REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS deliveries (
    sink TEXT NOT NULL,
    key TEXT NOT NULL,
    digest TEXT NOT NULL,
    sent REAL NOT NULL,
    PRIMARY KEY (sink, key)
);
"""


def default_home() -> Path:
    """Where projects keep their data: ``$LANGGRAPH_ART_HOME`` or ``./.art``."""
    return Path(os.environ.get("LANGGRAPH_ART_HOME", ".art"))


class TrajectoryStore:
    """Append and query trajectories and groups. Safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # durable against a killed process in WAL mode
        self._db.executescript(_SCHEMA)

    @classmethod
    def for_project(cls, project: str, home: str | os.PathLike[str] | None = None) -> TrajectoryStore:
        try:
            check_name(project)
        except ValueError as exc:
            raise ConfigError(f"project names are plain folder names like 'email-agent': {exc}") from None
        return cls(Path(home or default_home()) / project / "trajectories.sqlite")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> TrajectoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------------------------------
    def add_trajectory(self, trajectory: Trajectory) -> None:
        """Insert or update (rewards arrive later) one trajectory, in its own transaction."""
        self.add_trajectories([trajectory])

    def add_trajectories(self, trajectories: Iterable[Trajectory]) -> None:
        rows = [self._row(t) for t in trajectories]
        nodes = [(t.id, name) for t in trajectories for name in {s.name for s in t.spans}]
        with self._lock, self._transaction():
            self._db.executemany("INSERT OR REPLACE INTO trajectories VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            self._db.executemany("INSERT OR IGNORE INTO trajectory_nodes VALUES (?, ?)", nodes)

    def add_group(self, group: TrajectoryGroup, *, trajectories: bool = True) -> None:
        """Insert or update a group and (unless ``trajectories=False``: they are stored already) all its
        trajectories, atomically."""
        meta = group.model_dump(exclude={"trajectories"})
        step = group.metadata.get("policy_step")
        runs = group.trajectories if trajectories else []
        rows = [self._row(t) for t in runs]
        nodes = [(t.id, name) for t in runs for name in {s.name for s in t.spans}]
        with self._lock, self._transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO groups VALUES (?, ?, ?, ?, ?)",
                (group.id, group.scenario_id, step, time.time(), json.dumps(meta, default=repr)),
            )
            self._db.executemany("INSERT OR REPLACE INTO trajectories VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            self._db.executemany("INSERT OR IGNORE INTO trajectory_nodes VALUES (?, ?)", nodes)

    @staticmethod
    def _row(t: Trajectory) -> tuple[Any, ...]:
        step = t.metadata.get("policy_step")
        return (
            t.id,
            t.group_id,
            t.scenario_id,
            step if isinstance(step, int) else None,
            t.status,
            t.reward,
            t.start_time or time.time(),
            t.model_dump_json(),
        )

    def _transaction(self) -> Any:
        db = self._db

        class _Tx:
            def __enter__(self) -> None:
                db.execute("BEGIN IMMEDIATE")

            def __exit__(self, kind: object, *rest: object) -> None:
                db.execute("COMMIT" if kind is None else "ROLLBACK")

        return _Tx()

    # -- deliveries to other systems (e.g. Langfuse): what arrived, so a re-send sends only the rest --------
    def delivered(self, sink: str, keys: Iterable[str] | None = None) -> dict[str, str]:
        """``{key: digest}`` of what ``sink`` confirmed receiving (all of it, or only the given keys)."""
        query = "SELECT key, digest FROM deliveries WHERE sink = ?"
        if keys is None:
            with self._lock:
                return dict(self._db.execute(query, (sink,)).fetchall())
        wanted = list(dict.fromkeys(keys))
        found: dict[str, str] = {}
        for start in range(0, len(wanted), 500):  # look up only these keys: the ledger grows with every run
            chunk = wanted[start : start + 500]
            with self._lock:
                rows = self._db.execute(f"{query} AND key IN ({','.join('?' * len(chunk))})", (sink, *chunk))
                found.update(rows.fetchall())
        return found

    def mark_delivered(self, sink: str, items: Iterable[tuple[str, str]]) -> None:
        """Record ``(key, digest)`` pairs as received by ``sink`` (a changed digest means: send again)."""
        now = time.time()
        rows = [(sink, key, digest, now) for key, digest in items]
        with self._lock, self._transaction():
            self._db.executemany("INSERT OR REPLACE INTO deliveries VALUES (?, ?, ?, ?)", rows)

    # -- reading ---------------------------------------------------------------------------------------------
    def _where(
        self,
        step: int | None,
        scenario_id: str | None,
        group_id: str | None,
        node: str | None,
        status: str | None,
        since_step: int | None = None,
        split: str | None = None,
    ) -> tuple[str, list[Any]]:
        clauses, args = [], []
        for column, value in (("step", step), ("scenario_id", scenario_id), ("group_id", group_id), ("status", status)):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        if since_step is not None:
            clauses.append("step >= ?")
            args.append(since_step)
        if node is not None:
            clauses.append("id IN (SELECT trajectory_id FROM trajectory_nodes WHERE node = ?)")
            args.append(node)
        if split is not None:  # runs without one are training runs (stored before evaluation existed)
            clauses.append("COALESCE(json_extract(data, '$.metadata.split'), 'train') = ?")
            args.append(split)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args

    def iter_rows(
        self,
        *,
        step: int | None = None,
        scenario_id: str | None = None,
        group_id: str | None = None,
        node: str | None = None,
        status: str | None = None,
        since_step: int | None = None,
        split: str | None = None,
    ) -> Iterator[tuple[Any, ...]]:
        where, args = self._where(step, scenario_id, group_id, node, status, since_step, split)
        with self._lock:
            rows = self._db.execute(
                f"SELECT id, group_id, scenario_id, step, status, reward, created, data FROM trajectories{where} "
                "ORDER BY created, id",
                args,
            ).fetchall()
        yield from rows

    def trajectories(self, **filters: Any) -> list[Trajectory]:
        """Filter by ``step`` (or ``since_step``: that policy step and later), ``scenario_id``, ``group_id``, ``node``
        (ran that node), ``status`` and ``split`` (``"train"``, or ``"eval"``: the runs ``Trainer(eval_scenarios=...)``
        made and did not train on)."""
        return [Trajectory.model_validate_json(row[-1]) for row in self.iter_rows(**filters)]

    def count(self, **filters: Any) -> int:
        where, args = self._where(
            filters.get("step"),
            filters.get("scenario_id"),
            filters.get("group_id"),
            filters.get("node"),
            filters.get("status"),
            filters.get("since_step"),
            filters.get("split"),
        )
        with self._lock:
            return int(self._db.execute(f"SELECT COUNT(*) FROM trajectories{where}", args).fetchone()[0])

    def groups(self, *, step: int | None = None) -> list[TrajectoryGroup]:
        where, args = (" WHERE step = ?", [step]) if step is not None else ("", [])
        with self._lock:
            rows = self._db.execute(f"SELECT data FROM groups{where} ORDER BY created, id", args).fetchall()
        groups = []
        for (data,) in rows:
            group = TrajectoryGroup.model_validate({**json.loads(data), "trajectories": []})
            group.trajectories = self.trajectories(group_id=group.id)
            groups.append(group)
        return groups

    # -- export ----------------------------------------------------------------------------------------------
    def export_jsonl(self, path: str | os.PathLike[str], **filters: Any) -> int:
        """One trajectory JSON per line; returns how many were written."""
        count = 0
        target = Path(path)
        tmp = target.with_suffix(target.suffix + ".tmp")
        with tmp.open("w") as out:
            for row in self.iter_rows(**filters):
                out.write(row[-1] + "\n")
                count += 1
        tmp.replace(target)
        return count

    def export_parquet(self, path: str | os.PathLike[str], **filters: Any) -> int:
        """A Parquet table: id, group_id, scenario_id, step, status, reward, created, data (trajectory JSON)."""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ConfigError("Parquet export needs pyarrow: pip install 'langgraph-art[export]'") from exc
        rows = list(self.iter_rows(**filters))
        names = ["id", "group_id", "scenario_id", "step", "status", "reward", "created", "data"]
        columns = {name: [row[i] for row in rows] for i, name in enumerate(names)}
        types = [
            pa.string(),
            pa.string(),
            pa.string(),
            pa.int64(),
            pa.string(),
            pa.float64(),
            pa.float64(),
            pa.string(),
        ]
        table = pa.table({n: pa.array(columns[n], type=t) for n, t in zip(names, types, strict=True)})
        pq.write_table(table, path)
        return len(rows)
