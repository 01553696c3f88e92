"""Each setting is declared once (shared/settings/): the README's table is rendered from the
declarations, and every declaration reads its own variable."""

from __future__ import annotations

import ast
import dataclasses
import re

import pytest

from splatq.shared.config.vocabulary import CLASS_NAMES, STAGE_NAMES
from splatq.shared.engine.keys import STREAMS
from splatq.shared.engine.stages import ALL_STAGES
from splatq.shared.settings import Settings, SettingsError, declarations
from splatq.shared.settings import doc as settings_doc
from splatq.shared.settings.declare import declared
from tests.conftest import REPO_ROOT

SETTINGS_PACKAGE = REPO_ROOT / "shared" / "settings"


def test_the_readme_table_is_the_rendered_declarations() -> None:
    """A new setting, a changed default or doc: `python -m splatq.shared.settings.doc`."""
    readme = settings_doc.README.read_text(encoding="utf-8")
    assert settings_doc.BEGIN in readme
    assert settings_doc.with_table(readme) == readme, (
        "README.md's configuration table is stale: run python -m splatq.shared.settings.doc"
    )


def test_every_setting_is_declared_once_with_a_doc() -> None:
    decls = declarations()
    names = [d.env for d in decls]
    assert len(names) == len(set(names)), "a variable declared twice"
    assert all(re.fullmatch(r"SPLATQ_[A-Z0-9_]+", n) for n in names)
    assert all(d.doc.strip() and "\n" not in d.doc for d in decls)
    undeclared = {f.name for f in dataclasses.fields(Settings)} - {
        f.name for f in dataclasses.fields(Settings) if f.metadata
    }
    assert undeclared == {"redis_url_is_default"}  # derived from SPLATQ_REDIS_URL's absence
    rendered = settings_doc.render()
    assert all(f"| `{n}` |" in rendered for n in names)


def test_settings_import_nothing_from_the_engine() -> None:
    """shared/settings/ and shared/config/ sit below the engine (which imports them)."""
    for folder in (SETTINGS_PACKAGE, REPO_ROOT / "shared" / "config"):
        for path in folder.glob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    module = node.module or ""
                elif isinstance(node, ast.Import):
                    module = " ".join(a.name for a in node.names)
                else:
                    continue
                assert "splatq.shared.engine" not in module, (path.name, module)
                assert "splatq.services" not in module, (path.name, module)


def test_the_vocabulary_agrees_with_the_engine_enums() -> None:
    assert tuple(s.value for s in ALL_STAGES) == STAGE_NAMES
    assert tuple(s.value for s in STREAMS) == CLASS_NAMES


@pytest.mark.parametrize(
    ("field", "env"), [(f.name, d.env) for f, d in declared(Settings)], ids=str
)
def test_each_variable_is_read_into_its_own_field(field: str, env: str) -> None:
    """A malformed value is refused naming the variable, or lands in the variable's own field
    and nowhere else."""
    try:
        changed = Settings.from_env({env: "not a value ,:= x"})
    except SettingsError as exc:
        refused = str(exc)
    else:
        refused = ""
    if refused:
        assert env in refused
        return
    default = Settings.from_env({})
    differing = {
        f.name
        for f in dataclasses.fields(Settings)
        if getattr(changed, f.name) != getattr(default, f.name)
    }
    assert differing - {"redis_url_is_default"} == {field}
