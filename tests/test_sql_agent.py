"""examples/sql_agent.py: the shop database, its questions, the read-only tools, the execution-match reward, and a
training step through the tutorial's graph."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from tests.helpers import example, records


@pytest.fixture(scope="module")
def sql() -> Any:
    return example("sql_agent")


@pytest.fixture(scope="module")
def shop(sql: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sql.make_database(tmp_path_factory.mktemp("sql") / "shop-0.sqlite", seed=0)


def rows(path: Path, query: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as db:
        return db.execute(query).fetchall()


def test_the_database_is_a_shop_of_related_tables_made_from_its_seed(sql: Any, shop: Path, tmp_path: Path) -> None:
    tables = ("customers", "products", "orders", "order_items")
    counts = {table: rows(shop, f"SELECT COUNT(*) FROM {table}")[0][0] for table in tables}
    assert counts["customers"] == 600 and counts["orders"] == 3000 and counts["products"] >= 30
    assert counts["order_items"] > 5000 and sum(counts.values()) > 10_000
    # every reference resolves: each order's customer, each line's order and product
    for child, parent, key, column in [("orders", "customers", "customer_id", "email"),
                                       ("order_items", "orders", "order_id", "status"),
                                       ("order_items", "products", "product_id", "name")]:  # fmt: skip
        dangling = f"SELECT COUNT(*) FROM {child} LEFT JOIN {parent} USING ({key}) WHERE {column} IS NULL"
        assert rows(shop, dangling) == [(0,)], (child, parent)
    dump = lambda path: "\n".join(sqlite3.connect(path).iterdump())  # noqa: E731
    assert dump(sql.make_database(tmp_path / "again.sqlite", seed=0)) == dump(shop)  # the seed decides everything
    assert dump(sql.make_database(tmp_path / "other.sqlite", seed=1)) != dump(shop)


def test_the_questions_need_a_filter_a_join_or_an_aggregate_and_each_has_an_answer(sql: Any, shop: Path) -> None:
    questions = sql.make_questions(shop, 30, seed=0)
    assert questions == sql.make_questions(shop, 30, seed=0)  # reproducible
    assert len({q["question"] for q in questions}) == 30
    assert {q["kind"] for q in questions} == {"filter", "join", "aggregate"}
    for q in questions:
        assert q["id"].startswith(f"shop-0/{q['kind']}/") and q["database"] == str(shop)
        assert [list(r) for r in rows(shop, q["reference"])] == q["answer"] and q["answer"] not in ([[0]], [[None]])
        reference = q["reference"].upper()
        assert {"filter": " WHERE " in reference, "join": " JOIN " in reference,
                "aggregate": "AVG(" in reference or "SUM(" in reference}[q["kind"]]  # fmt: skip
    with pytest.raises(ValueError, match="ask for fewer"):
        sql.make_questions(shop, 10_000, seed=0)


def test_the_tools_only_read_and_a_long_query_is_stopped(sql: Any, shop: Path, tmp_path: Path) -> None:
    state = {"database": str(shop)}
    query = lambda q: sql.sql_db_query.invoke({"query": q, "state": state})  # noqa: E731
    before = hashlib.sha256(shop.read_bytes()).hexdigest()
    assert sql.sql_db_list_tables.invoke({"state": state}) == "customers, order_items, orders, products"
    schema = sql.sql_db_schema.invoke({"table_names": "orders, products", "state": state})
    assert "CREATE TABLE orders" in schema and "3 rows from products table" in schema
    assert "not found" in sql.sql_db_schema.invoke({"table_names": "order", "state": state})
    attached = tmp_path / "attached.sqlite"
    for statement in ["DELETE FROM orders", "INSERT INTO products VALUES (99, 'x', 'y', 1.0)", "DROP TABLE orders",
                      "UPDATE customers SET city = 'x'", f"ATTACH DATABASE '{attached}' AS other",
                      "CREATE TEMP TABLE t (x)", "PRAGMA query_only = OFF"]:  # fmt: skip
        assert query(statement).startswith("Error: not authorized (the database is read-only"), statement
    assert query("SELECT 1; DELETE FROM orders").startswith("Error: You can only execute one statement")
    assert not attached.exists() and hashlib.sha256(shop.read_bytes()).hexdigest() == before
    assert query("SELECT nme FROM customers") == "Error: no such column: nme"
    started = time.monotonic()
    endless = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT COUNT(*) FROM n"
    assert query(endless) == f"Error: the query ran longer than {sql.QUERY_SECONDS:g} s and was stopped"
    assert time.monotonic() - started < sql.QUERY_SECONDS + 1.5
    assert query("SELECT COUNT(*) FROM orders") == "[(3000,)]"  # the next query runs as usual
    assert query("SELECT customer_id FROM customers").endswith(f"... ({600 - sql.MAX_ROWS} more rows)")


def asked(sql: Any, shop: Path, *queries: str, answer: str = "It is done.") -> dict[str, Any]:
    """A finished run's state: the question, one ``sql_db_query`` call per query with its result, then ``answer``."""
    messages: list[Any] = [HumanMessage("How many orders were cancelled in 2024?")]
    for n, q in enumerate(queries):
        messages.append(AIMessage("", tool_calls=[{"id": f"c{n}", "name": "sql_db_query", "args": {"query": q}}]))
        messages.append(ToolMessage(sql.sql_db_query.invoke({"query": q, "state": {"database": str(shop)}}),
                                    tool_call_id=f"c{n}"))  # fmt: skip
    messages.append(AIMessage(answer))
    return {"messages": messages, "database": str(shop)}


def test_execution_match_compares_the_last_querys_rows_with_the_references(sql: Any, shop: Path) -> None:
    reference = "SELECT name, unit_price FROM products WHERE category = 'Garden' AND unit_price > 30"
    average = "SELECT AVG(unit_price) FROM products WHERE category = 'Garden'"
    scenario = {"database": str(shop), "answer": [list(r) for r in rows(shop, reference)]}
    averaged = {"database": str(shop), "answer": [list(r) for r in rows(shop, average)]}
    match = lambda state, s=scenario: sql.execution_match.fn(state, s)  # noqa: E731
    assert match(asked(sql, shop, reference)) == 1.0
    assert match(asked(sql, shop, reference + " ORDER BY unit_price DESC")) == 1.0  # rows in any order
    assert match(asked(sql, shop, "SELECT unit_price AS p, name FROM products WHERE unit_price > 30 "
                                  "AND category = 'Garden'")) == 1.0  # fmt: skip  # columns in any order
    assert match(asked(sql, shop, "SELECT name FROM products WHERE category = 'Garden' AND unit_price > 30")) == 0.0
    assert match(asked(sql, shop, "SELECT name, unit_price FROM products WHERE unit_price > 30")) == 0.0  # more rows
    assert match(asked(sql, shop, reference + " LIMIT 1")) == 0.0
    assert match(asked(sql, shop, reference, "SELECT 1")) == 0.0  # the last query counts
    assert match(asked(sql, shop, "SELECT 1", reference)) == 1.0
    assert match(asked(sql, shop, "SELEC name FROM products")) == 0.0  # a query that fails
    assert match(asked(sql, shop)) == 0.0  # no query
    assert match(asked(sql, shop, "SELECT ROUND(AVG(unit_price), 2) FROM products WHERE category = 'Garden'"),
                 averaged) == 1.0  # fmt: skip  # numbers compared to 2 decimals
    assert match(asked(sql, shop, "SELECT AVG(unit_price) + 0.01 FROM products WHERE category = 'Garden'"),
                 averaged) == 0.0  # fmt: skip
    assert sql.answered.fn(asked(sql, shop, reference)) == 1.0
    assert sql.answered.fn(asked(sql, shop, reference, answer="")) == 0.0
    assert sql.queries_run.fn(asked(sql, shop, reference, "SELECT 1")) == 2.0


def test_held_out_questions_are_on_the_training_database_and_on_one_never_seen(sql: Any, tmp_path: Path) -> None:
    train, held_out = sql.split(tmp_path, 3, train=12, held_out=8)
    assert len(train) == 12 and len(held_out) == 8
    assert {s["database"] for s in train} == {str(tmp_path / "sql-agent" / "shop-3.sqlite")}
    assert [Path(s["database"]).stem for s in held_out] == ["shop-3"] * 4 + ["shop-1003"] * 4
    assert not {s["question"] for s in train} & {s["question"] for s in held_out if "shop-3/" in s["id"]}
    assert all(s["input"]["database"] == s["database"]
               and s["input"]["messages"] == [("system", sql.SYSTEM), ("user", s["question"])]
               for s in train + held_out)  # fmt: skip


@pytest.mark.slow
def test_the_sql_agent_runs_the_tutorials_graph_and_trains_a_step(sql: Any, tmp_path: Path) -> None:
    """The example end to end on the tiny model (plumbing: the model is random): the tutorial's graph (the tables
    listed, a forced schema call, a forced first query, then queries or an answer), held-out evaluations on both
    databases, a GRPO step, every run scored."""
    argv = ["--base-model", "tiny", "--steps", "1", "--train-questions", "4", "--held-out", "4",
            "--eval-generations", "1", "--num-generations", "2", "--max-tokens", "16", "--threads", "1",
            "--home", str(tmp_path)]  # fmt: skip
    summary = sql.main(argv, echo=lambda *a: None)
    logged = records(summary["run_dir"])
    assert [(r["split"], r["iteration"]) for r in logged] == [("eval", 0), ("train", 1), ("eval", 1)]
    assert logged[1]["runs/failed"] == 0 and logged[1]["reward/runs_scored"] == 4
    assert [(row["step"], row["runs"], sorted(row["db"])) for row in summary["held_out"]] == [
        (0, 4, ["shop-0", "shop-1000"]),
        (1, 4, ["shop-0", "shop-1000"]),
    ]
    run = summary["last_run"]  # the tables listed for the model, then its forced schema call, under a grammar
    assert run.tool_calls()[0].name == "sql_db_list_tables" and run.tool_calls()[0].result.startswith("customers")
    assert run.turns()[0].node == "call_get_schema" and run.turns()[0].grammar is not None
    assert run.turns()[1].node == "generate_query" and run.turns()[1].grammar is not None  # the first query, forced
