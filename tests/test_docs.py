"""The docs stay a true map: docs/configuration.md lists exactly the environment variables
config/settings.py reads, every relative link in README.md and docs/ names a file of the
repository, every `make` target they name is the Makefile's, and no file cites a document the repository
does not have.

Settings are read from the source, not from an imported module: a variable read only in a
branch (production, one connector) counts as much as one read at every start."""

import ast
import itertools
import re
from pathlib import Path

from config import settings as product_settings

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ROOT / "config" / "settings.py"
CONFIGURATION = ROOT / "docs" / "configuration.md"
ELSEWHERE = "## Read elsewhere"
# Where a variable read elsewhere may be read: the product, its scripts, its client.
SOURCES = ("Makefile", "config", "ledger", "approvals", "dlq", "sandbox", "demo", "client", "scripts", "sharding")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# What a loop over the action types stands for in a variable's name (`CONNECTOR_<ACTION_TYPE>`).
ACTION_TYPE = "<action_type>"


def env_helpers(tree):
    """The functions at the top of settings.py that read os.environ: env_str, env_bool, ..."""
    return {node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and "os.environ" in ast.unparse(node)}


def loop_iterables(tree):
    """Each loop variable of settings.py (a for or a comprehension) with what it iterates."""
    loops = [(n.target, n.iter) for n in ast.walk(tree) if isinstance(n, (ast.For, ast.comprehension))]
    return {target.id: iterable for target, iterable in loops if isinstance(target, ast.Name)}


def values_of(iterable):
    """The values a loop variable in a name takes: the action types as one placeholder; an
    option table's option names."""
    source = min((n for n in ast.walk(iterable) if isinstance(n, ast.Name)), key=lambda n: n.col_offset).id
    if source == "ACTION_TYPES":
        return [ACTION_TYPE]
    table = getattr(product_settings, source)
    return sorted({v for vs in table.values() for v in vs}) if isinstance(table, dict) else list(table)


def rendered(name_node, loops):
    """A variable's name, or each name an f-string makes over the loop values it uses."""
    if isinstance(name_node, ast.Constant):
        return [name_node.value]
    used = sorted({n.id for n in ast.walk(name_node) if isinstance(n, ast.Name)})
    names = []
    for values in itertools.product(*(values_of(loops[name]) for name in used)):
        env = dict(zip(used, values))
        names.append("".join(part.value if isinstance(part, ast.Constant) else str(eval(ast.unparse(part.value), env))
                             for part in name_node.values))
    return names


def settings_reads():
    tree = ast.parse(SETTINGS.read_text())
    helpers, loops = env_helpers(tree), loop_iterables(tree)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id in helpers and n.args]
    return {name for call in calls for name in rendered(call.args[0], loops)}


def documented(text):
    """The variables named in the first column of the page's tables."""
    rows = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `")]
    return {name for cell in rows for name in re.findall(r"`([A-Z][A-Z0-9_<>]*)`", cell)}


def test_the_configuration_page_lists_exactly_the_variables_settings_reads():
    read = settings_reads()
    main, _, _ = CONFIGURATION.read_text().partition(ELSEWHERE)
    listed = documented(main)
    assert read, "no environment read found in config/settings.py: the helpers' names changed?"
    assert read - listed == set(), "read by config/settings.py, missing from docs/configuration.md"
    assert listed - read == set(), "in docs/configuration.md, but config/settings.py does not read it"


def test_the_variables_read_elsewhere_are_read_where_the_page_says():
    _, _, elsewhere = CONFIGURATION.read_text().partition(ELSEWHERE)
    listed = documented(elsewhere)
    assert listed, f"docs/configuration.md has no {ELSEWHERE!r} table"
    assert listed & settings_reads() == set(), "read by config/settings.py: list it in the main tables"
    files = [p for s in SOURCES for p in ([ROOT / s] if (ROOT / s).is_file() else (ROOT / s).rglob("*"))
             if p.is_file() and p.suffix in ("", ".py", ".sh")]
    text = "\n".join(p.read_text(errors="ignore") for p in files)
    assert {name for name in listed if not re.search(rf"\b{name}\b", text)} == set()


def test_every_relative_link_in_the_docs_names_a_file_of_the_repository():
    broken = []
    for page in DOCS:
        for target in LINK.findall(page.read_text()):
            path = target.split("#")[0]
            if not path or re.match(r"[a-z]+:", path):
                continue
            if not (page.parent / path).resolve().exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_no_file_cites_a_document_the_repository_does_not_have():
    missing = [name.upper() + ".md" for name in ("design", "contract")]  # the docs/ pages' old, outside names
    citing = [f"{path.relative_to(ROOT)}: {name}"
              for package in (*SOURCES[1:], "templates", "tests", "bench", "docs")
              for path in (ROOT / package).rglob("*") if path.suffix in (".py", ".html", ".md") and path.is_file()
              for name in missing if name in path.read_text(errors="ignore")]
    citing += [f"README.md: {name}" for name in missing if name in (ROOT / "README.md").read_text()]
    assert citing == []


def test_every_make_target_the_docs_name_is_one_of_the_makefile():
    """`make run`, `make incident`, ... as the README and docs/ write them (inline or at the start of a
    line in a shell block) are targets of the Makefile, and `make help` names all but `static`."""
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):(?!=)", makefile, re.MULTILINE))
    named = {(page.relative_to(ROOT), target) for page in DOCS if "decisions" not in page.parts
             for target in re.findall(r"(?:`|^)make ([a-z][a-z-]*)", page.read_text(), re.MULTILINE)}
    assert {(str(page), target) for page, target in named if target not in targets} == set()
    helped = set(re.findall(r"@echo \"make ([a-z][a-z-]*)", makefile))
    assert targets - helped - {"help", "static", "scale"} == set(), "README.md: `make help` lists the targets"
