"""The README and the docs site say what the code does: the site builds strictly (no broken link or anchor), every
``python`` block compiles and its imports and ``art.`` names exist, every ``python`` block runs unless it is marked a
fragment (and says why), the quick start runs end to end, the ``langgraph-art`` and ``./dev`` commands shown exist,
the README stays short, the metrics reference lists every metric key the code logs (and no key it does not), and the
file map names every package folder.

Each ``python`` block has a marker on the line before it (docs/development.md, "These docs"):

- ``<!-- test: run -->``: it runs as written, on the tiny model (``TINY`` below: ``"smollm2-135m"`` becomes
  ``"tiny"`` and every ``steps=N`` ``steps=1``);
- ``<!-- test: run with=agent,groups -->``: the same, after setups of ``tests/docs_worker.py`` have defined what the
  page calls yours (``build_my_graph``, ``found_answer``, ``scenarios``...);
- ``<!-- test: quickstart -->``: the quick start, the same in README.md and docs/index.md: it runs with
  ``QUICKSTART_TINY``'s replacements (each must match once), and unchanged, on SmolLM2-135M, when
  ``LANGGRAPH_ART_DOCS_REAL_MODEL=1``;
- ``<!-- test: fragment: why -->``: it only compiles (a GPU, a Ray cluster, a Langfuse server...); at most
  ``MAX_FRAGMENTS`` of these.

The blocks run in one process, ``tests/docs_worker.py`` (torch and the tiny model load once)."""

from __future__ import annotations

import ast
import functools
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
MARK = re.compile(
    r"<!-- test: (?:(?P<run>run)(?: with=(?P<setups>[\w,]+))?|(?P<quickstart>quickstart)|fragment: (?P<why>.+)) -->"
)
TINY = [(r'"smollm2-135m"', '"tiny"'), (r"\bsteps=\d+", "steps=1")]  # (regex, replacement) for every run block
QUICKSTART_TINY = {'base_model="smollm2-135m"': 'base_model="tiny"', "steps=10": "steps=2"}
MAX_FRAGMENTS = 6
REAL_MODEL = os.environ.get("LANGGRAPH_ART_DOCS_REAL_MODEL") == "1"


class Block(NamedTuple):
    where: str  # page:line
    code: str
    mark: re.Match[str] | None  # the marker on the line before it


def blocks(lang: str) -> list[Block]:
    """Every fenced block of ``lang`` in the README and the docs, with its marker."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group("lang") != lang:
                continue
            line = text.count("\n", 0, match.start()) + 1
            before = text[: match.start()].rstrip().splitlines()
            mark = MARK.fullmatch(before[-1].strip()) if before else None
            indent = match.group("indent")
            lines = match.group("body").splitlines(True)
            body = "".join(s[len(indent) :] if s.startswith(indent) else s for s in lines)
            found.append(Block(f"{page.relative_to(ROOT)}:{line}", body, mark))
    return found


PYTHON = blocks("python")
BASH = blocks("bash")
QUICKSTARTS = [b for b in PYTHON if b.mark and b.mark["quickstart"]]


def on_tiny(block: Block) -> str:
    """The block as the tests run it."""
    code = block.code
    if block.mark and block.mark["quickstart"]:
        for old, new in QUICKSTART_TINY.items():
            code = code.replace(old, new)
        return code
    for pattern, new in TINY:
        code = re.sub(pattern, new, code)
    return code


def setups(block: Block) -> list[str]:
    """The setups its marker names (``run with=agent,groups``)."""
    named = block.mark["setups"] if block.mark else None
    return named.split(",") if named else []


def executed() -> list[Block]:
    """The blocks that run, the quick start once."""
    run = [b for b in PYTHON if b.mark and b.mark["run"]]
    return run + QUICKSTARTS[:1]


def test_the_pages_have_code_blocks() -> None:
    assert len(PYTHON) >= 15 and len(BASH) >= 15, (len(PYTHON), len(BASH))  # the extraction found them


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 160, f"README.md has {lines} lines: move detail to docs/ (the bar is 160)"


def test_the_readmes_relative_links_exist() -> None:
    """The README is not part of the site, so the strict build does not see its links: each must name a file."""
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'src="([^"]+)"', text)
    local = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert local
    missing = sorted(t for t in local if not (ROOT / t).exists())
    assert not missing, f"README.md links to files that do not exist: {missing}"


@pytest.mark.parametrize("block", PYTHON, ids=[b.where for b in PYTHON])
def test_python_block_compiles_and_its_imports_and_names_exist(block: Block) -> None:
    where, code = block.where, block.code
    tree = compile(code, where, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    compile(tree, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    modules: dict[str, object] = {}  # name bound by `import x [as y]` -> the module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            statement = ast.unparse(node)
            try:
                exec(statement, {})
            except ImportError as exc:
                pytest.fail(f"{where}: `{statement}` fails: {exc}")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    modules[alias.asname] = importlib.import_module(alias.name)
                elif "." not in alias.name:
                    modules[alias.name] = importlib.import_module(alias.name)
    missing = sorted(
        f"{node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
        and not hasattr(modules[node.value.id], node.attr)
    )
    assert not missing, f"{where} uses names its modules do not have: {missing}"


def test_every_python_block_runs_or_is_a_fragment_that_says_why() -> None:
    from tests.docs_worker import SETUPS

    unmarked = [b.where for b in PYTHON if b.mark is None]
    assert not unmarked, (
        f"python blocks without a marker: {unmarked}. Put <!-- test: run --> (or run with=SETUP, from "
        f"tests/docs_worker.py: {sorted(SETUPS)}) on the line before each, or <!-- test: fragment: why --> where it "
        "cannot run in a test (a GPU, a cluster, a server elsewhere)"
    )
    unknown = {b.where: setups(b) for b in PYTHON if set(setups(b)) - set(SETUPS)}
    assert not unknown, f"setups tests/docs_worker.py does not have: {unknown}"
    fragments = [b.where for b in PYTHON if b.mark and b.mark["why"]]
    assert len(fragments) <= MAX_FRAGMENTS, f"{len(fragments)} fragments (at most {MAX_FRAGMENTS}): {fragments}"


def test_the_quickstart_is_the_same_in_the_readme_and_the_docs() -> None:
    assert [b.where.split(":")[0] for b in QUICKSTARTS] == ["README.md", "docs/index.md"]
    assert QUICKSTARTS[0].code == QUICKSTARTS[1].code, "README.md and docs/index.md show different quick starts"
    for old in QUICKSTART_TINY:  # what the test replaces is there, once: the quick start and the test stay in step
        assert QUICKSTARTS[0].code.count(old) == 1, (
            f"the quick start has {old!r} {QUICKSTARTS[0].code.count(old)} times"
        )
    for hyper_parameter in ("learning_rate", "temperature"):  # the library's defaults, measured: not restated
        assert hyper_parameter not in QUICKSTARTS[0].code


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every block that runs, run by tests/docs_worker.py in one process: its result by where it is."""
    folder = tmp_path_factory.mktemp("docs-blocks")
    todo = [{"where": b.where, "code": on_tiny(b), "setups": setups(b)} for b in executed()]
    (folder / "blocks.json").write_text(json.dumps(todo))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    try:
        out = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "docs_worker.py"), "blocks.json", "results.jsonl"],
            cwd=folder, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        tail = (out.stdout + out.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        tail = f"timed out after {exc.timeout} s"
    written = folder / "results.jsonl"
    found = {r["where"]: r for r in map(json.loads, written.read_text().splitlines() if written.exists() else [])}
    for block in executed():
        found.setdefault(block.where, {"ok": False, "error": f"the worker stopped before this block: {tail}"})
    for other in QUICKSTARTS[1:]:
        found[other.where] = found[QUICKSTARTS[0].where]
    return found


RUN = [b for b in PYTHON if b.mark and (b.mark["run"] or b.mark["quickstart"])]


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_python_block_runs(block: Block, ran: dict[str, dict[str, Any]]) -> None:
    result = ran[block.where]
    assert result["ok"], f"{block.where} failed (as run, on the tiny model):\n{result['error']}"


def test_the_quickstart_trains_on_the_tiny_model(ran: dict[str, dict[str, Any]]) -> None:
    """It printed the reward of each of its (2) steps."""
    result = ran[QUICKSTARTS[0].where]
    assert result["ok"], result["error"]
    rewards = ast.literal_eval(result["output"].strip().splitlines()[-1])
    assert len(rewards) == 2 and all(0 <= r <= 1 for r in rewards), result["output"]


@pytest.mark.slow
@pytest.mark.skipif(not REAL_MODEL, reason="LANGGRAPH_ART_DOCS_REAL_MODEL=1 runs the quick start on SmolLM2-135M")
def test_the_quickstart_runs_unchanged_on_the_real_model(tmp_path: Path) -> None:
    code = QUICKSTARTS[0].code
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # every core, as a user's run has
    env.update({"HF_HUB_OFFLINE": "1", "LANGGRAPH_ART_HOME": str(tmp_path / ".art")})
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=3600)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    rewards = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    print("quick start on smollm2-135m, reward per step:", rewards)
    assert len(rewards) == 10


# -- docstrings ----------------------------------------------------------------------------------------------------
DOCUMENTED = ["TrainableModel", "ChatART", "Trainer", "LocalBackend", "RemoteBackend", "GRPOConfig", "RulerJudge",
              "reward", "Branching", "TrajectoryCallbackHandler"]  # fmt: skip


def parameters(obj: Any) -> set[str]:
    """What a caller passes: a pydantic model's fields (and their aliases), a dataclass's fields, or the
    signature of a function or a class's ``__init__``."""
    import dataclasses
    import inspect

    from pydantic import BaseModel

    if isinstance(obj, type) and issubclass(obj, BaseModel):
        return set(obj.model_fields) | {f.alias for f in obj.model_fields.values() if f.alias}
    if dataclasses.is_dataclass(obj):
        return {f.name for f in dataclasses.fields(obj)}
    return set(inspect.signature(obj.__init__ if isinstance(obj, type) else obj).parameters) - {"self"}


@pytest.mark.parametrize("name", DOCUMENTED)
def test_public_docstrings_have_their_arguments_and_an_example(name: str) -> None:
    """Google style, as LangChain and TRL write them: an ``Args:`` section naming exactly the parameters (a
    subset for ChatART, whose other fields are ChatOpenAI's; none for GRPOConfig, whose fields carry their own
    descriptions) and an ``Example:`` with a ```python block that compiles."""
    import inspect
    import textwrap

    import langgraph_art as art

    obj = getattr(art, name)
    doc = inspect.getdoc(obj) or ""
    example = re.search(r"^Example:\n    ```python\n(.*?)^    ```", doc, re.M | re.S)
    assert example, f"art.{name}'s docstring has no 'Example:' section holding a ```python block"
    compile(textwrap.dedent(example.group(1)), f"art.{name}'s example", "exec")
    if name == "GRPOConfig":
        return
    section = re.search(r"^Args:\n(.*?)(?=^\S|\Z)", doc, re.M | re.S)
    assert section, f"art.{name}'s docstring has no 'Args:' section"
    documented = set(re.findall(r"^    (?:\*\*)?(\w+):", section.group(1), re.M))
    accepted = parameters(obj)
    if name == "ChatART":
        assert documented - {"kwargs"} <= accepted, f"ChatART documents {documented - accepted - {'kwargs'}}"
    else:
        assert documented == accepted, (
            f"art.{name}: parameters not documented {sorted(accepted - documented)}, documented but not parameters "
            f"{sorted(documented - accepted)}"
        )


# -- commands in bash blocks ---------------------------------------------------------------------------------------
def commands(prefix: str) -> list[tuple[str, list[str]]]:
    """Every line of a bash block that starts with ``prefix``, split as the shell would (comments dropped)."""
    out = []
    for where, code, _ in BASH:
        for line in code.splitlines():
            line = line.strip()
            if line.startswith(prefix + " ") or line == prefix:
                out.append((where, shlex.split(line, comments=True)[1:]))
    return out


def test_cli_commands_shown_in_the_docs_parse() -> None:
    import typer.main

    from langgraph_art.cli import app

    root = typer.main.get_command(app)
    shown = commands("langgraph-art")
    assert shown
    for where, args in shown:
        command: Any = root
        rest, path = list(args), ["langgraph-art"]
        while getattr(command, "commands", None) and rest and not rest[0].startswith("-"):
            name = rest.pop(0)
            if name not in command.commands:
                if path[-1] == "export":  # export commands come from integrations; this one is not installed here
                    break
                pytest.fail(f"{where}: `{' '.join(path)} {name}` is no command (have: {sorted(command.commands)})")
            command, path = command.commands[name], [*path, name]
        else:
            try:
                command.make_context(" ".join(path), list(rest))
            except Exception as exc:  # noqa: BLE001 - click's usage errors (typer's own click): unknown option...
                pytest.fail(f"{where}: `{' '.join(path + rest)}`: {type(exc).__name__}: {exc}")


def test_dev_commands_shown_in_the_docs_exist() -> None:
    script = (ROOT / "dev").read_text()
    known = set(re.findall(r"^\s*([\w|-]+)\)", script, re.M))
    known = {name for names in known for name in names.split("|")}
    shown = commands("./dev")
    assert shown
    for where, args in shown:
        assert args and args[0] in known, f"{where}: `./dev {' '.join(args)}`: the dev script has {sorted(known)}"


# -- the site ------------------------------------------------------------------------------------------------------
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """Broken links and anchors, a missing included file, a GRPOConfig field without help: each fails the build."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    html = (tmp_path / "site" / "reference" / "grpo-config" / "index.html").read_text()
    from langgraph_art.config import GRPOConfig

    missing = [name for name in GRPOConfig.model_fields if f"<code>{name}</code>" not in html]
    assert not missing, f"the generated GRPOConfig table lacks {missing}"
    assert "--max-trainers" in (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    from langgraph_art.errors import HTTP_ERRORS

    errors_page = (tmp_path / "site" / "reference" / "http-api" / "index.html").read_text()
    assert all(f"<code>{cls.__name__}</code>" in errors_page for cls, *_ in HTTP_ERRORS)
    assert "<!-- generated:" not in "".join(p.read_text() for p in (tmp_path / "site").rglob("*.html"))


# -- metrics -------------------------------------------------------------------------------------------------------
FAMILIES = ("train", "reward", "eval", "time", "off_policy", "judge", "runs", "rollouts")
KEY = re.compile(rf"^(?:{'|'.join(FAMILIES)})/[^/\s][^\s]*$")


def _literal(node: ast.AST) -> str | None:
    """A string constant, or an f-string with ``{}`` for each placeholder."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append("{}")
        return "".join(parts)
    return None


@functools.cache
def code_strings() -> frozenset[str]:
    """Every string literal of the library, each f-string whole (its pieces are not literals of their own)."""
    out = set()
    for path in (ROOT / "langgraph_art").rglob("*.py"):
        tree = ast.parse(path.read_text())
        pieces = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
        for node in ast.walk(tree):
            text = None if id(node) in pieces else _literal(node)
            if text is not None:
                out.add(text)
    return frozenset(out)


def code_keys() -> set[str]:
    """Metric keys the library writes: string literals (and f-strings) shaped like ``train/...``, ``reward/...``
    (not a glob such as ``runs/*/...``)."""
    return {s for s in code_strings() if KEY.match(s) and "*" not in s}


def documented_keys() -> set[str]:
    """The backticked keys in the first column of the metrics reference's tables."""
    text = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    keys = set()
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) > 2 and line.startswith("|"):
            keys |= {k for k in re.findall(r"`([^`]+)`", cells[1]) if KEY.match(k)}
    return keys


def _pattern(key: str) -> re.Pattern[str]:
    """``train/skipped/{}`` or ``train/skipped/<reason>`` -> a regex where each placeholder is any non-empty text."""
    parts = re.split(r"\{\}|<[^>]+>", key)
    return re.compile(".+".join(re.escape(p) for p in parts) + r"\Z")


def test_every_metric_key_the_code_logs_is_documented() -> None:
    documented = documented_keys()
    assert len(documented) > 30
    # a documented placeholder stands for text: make it a sample value a code pattern can match
    samples = {re.sub(r"<[^>]+>", "x", key) for key in documented}
    undocumented = sorted(key for key in code_keys() if not any(_pattern(key).match(sample) for sample in samples))
    assert not undocumented, f"metric keys the code writes that docs/reference/metrics.md does not list: {undocumented}"


def _sample(key: str) -> str:
    return re.sub(r"\{\}|<[^>]+>", "x", key)


def test_every_documented_metric_key_is_logged_by_the_code() -> None:
    """A documented key is a literal of the code, or what a template of the code (``f"train/{k}"``) makes with a
    string the code holds (``"loss"``); a documented family (``reward/<name>``) needs a template that makes it."""
    strings, keys = code_strings(), code_keys()
    stale = []
    for doc in sorted(documented_keys()):
        if doc in keys:
            continue
        for key in keys:
            if "{}" not in key and "<" not in doc:
                continue
            if not (_pattern(key).match(_sample(doc)) or _pattern(doc).match(_sample(key))):
                continue
            if "<" in doc:
                break
            tail = doc[len(key.partition("{}")[0]) :]
            if tail in strings or tail.rsplit("/", 1)[-1] in strings:
                break
        else:
            stale.append(doc)
    assert not stale, f"docs/reference/metrics.md lists keys the code never writes: {stale}"


# -- the file map --------------------------------------------------------------------------------------------------
def test_the_file_map_names_every_package_folder() -> None:
    """A folder the code gains (or moves to) must be in docs/design/file-map.md, and a folder it names must exist."""
    text = (ROOT / "docs" / "design" / "file-map.md").read_text()
    folders = {"langgraph_art/"} | {
        f"{init.parent.relative_to(ROOT).as_posix()}/" for init in (ROOT / "langgraph_art").rglob("__init__.py")
    }
    folders |= {f"{p.relative_to(ROOT).as_posix()}/" for p in (ROOT / "integrations").iterdir() if p.is_dir()}
    missing = sorted(f for f in folders if f"`{f}`" not in text)
    assert not missing, f"docs/design/file-map.md does not name {missing}"
    named = re.findall(r"^\| `((?:langgraph_art|integrations)/[^`]*)`", text, re.M)
    gone = sorted(f for f in named if not (ROOT / f).is_dir())
    assert not gone, f"docs/design/file-map.md names folders that do not exist: {gone}"
