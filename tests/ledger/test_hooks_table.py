"""docs/architecture.md's hooks table is the registries as they are: its first two columns
(each hook, and what every app registers with it) are printed here from `ledger.hooks` after
the apps' `ready()` ran, and must read the same. Its third column is the reader's prose."""

import re
from itertools import groupby
from pathlib import Path

from ledger import hooks

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
HEADER = "| hook | registered by | what it is for |"


def app_of(thing):
    return getattr(thing, "__module__", None) or thing.__name__


def cell(registrations):
    """`app: \\`name\\`, \\`name\\`; app: …` for (object, name) pairs, in registration order."""
    by_app = groupby(registrations, key=lambda pair: app_of(pair[0]).split(".")[0])
    return "; ".join(f"{app}: " + ", ".join(f"`{name}`" for _, name in pairs) for app, pairs in by_app)


def registered():
    """The hooks table's first two columns, from the registries."""
    rows = [(f"`on_move({model.__name__}, reaction)`", cell((r, r.__name__) for r in reactions))
            for model, reactions in hooks._reactions.items() if reactions]
    policy = hooks.policy()
    rows.append(("`set_policy(policy)`", cell([(policy, getattr(policy, "__name__", type(policy).__name__))])))
    redrivable = hooks._redrivable[0]
    rows.append(("`set_redrivable(predicate)`", cell([(redrivable, redrivable.__name__)])))
    effect_failed = hooks._effect_failed[0]
    rows.append(("`set_effect_failed(reaction)`", cell([(effect_failed, effect_failed.__name__)])))
    return rows


def documented():
    text = ARCHITECTURE.read_text()
    table = text[text.index(HEADER):].split("\n\n")[0].splitlines()[2:]
    return [tuple(part.strip() for part in re.split(r"(?<!\\)\|", row)[1:3]) for row in table]


def printed(rows):
    return "\n".join(f"| {hook} | {by} |" for hook, by in rows)


def test_the_architecture_page_lists_every_registration_of_every_hook():
    assert documented() == registered(), (
        "docs/architecture.md's hooks table differs from the registries; its first two columns are:\n"
        + printed(registered()))


def test_every_registering_function_of_the_hooks_module_has_a_row():
    registering = {name for name in dir(hooks) if name.startswith(("on_", "set_")) and callable(getattr(hooks, name))}
    in_table = {re.match(r"`(\w+)\(", hook).group(1) for hook, _ in documented()}
    assert in_table == registering
