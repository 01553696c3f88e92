"""Each setting is declared once (shared/settings/): the README's table is rendered from the
declarations, every SPLATQ_* variable the code names is one of them, and the settings read
the environment alone."""

from __future__ import annotations

import ast
import dataclasses
import re

import pytest

from splatq.shared.config.vocabulary import CLASS_NAMES, STAGE_NAMES
from splatq.shared.engine.keys import STREAMS
from splatq.shared.engine.stages import ALL_STAGES
from splatq.shared.settings import Settings, SettingsError, declarations, declared_variables
from splatq.shared.settings import doc as settings_doc
from splatq.shared.settings.declare import declared
from tests.helpers import REPO_ROOT

SETTINGS_PACKAGE = REPO_ROOT / "shared" / "settings"
VARIABLE = re.compile(r"\bSPLATQ_[A-Z0-9_]+")

# Names that look like variables in production code but are none: why each is allowed.
NOT_VARIABLES = {
    # The page global the local viewer embeds its scene in (services/gateway/local_viewer.py).
    "SPLATQ_SCENE",
    # Prose for SPLATQ_TENANT_MAX_RUNNING_INTERACTIVE / _SYNTHESIS (both declared).
    "SPLATQ_TENANT_MAX_RUNNING_",
    # The image's build argument (Dockerfile, Makefile): the version it labels, never read
    # at run time.
    "SPLATQ_VERSION",
}

# Production modules outside shared/settings/ that read the process environment: none. The
# rest of it -- CUDA_VISIBLE_DEVICES, a vendor's secret variables, a child's environment --
# is read in shared/settings/environ.py. (shared/liveness.py's `environ` is a WSGI request's.)
ENVIRONMENT_READERS: set[str] = set()
ENVIRONMENT_READ = re.compile(r"\bos\.environ\b|\bgetenv\(|\bos\.getenvb?\b")


def production_sources() -> dict[str, str]:
    """{repo-relative path: source} of shared/ and services/, settings excluded."""
    out = {}
    for top in ("shared", "services"):
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            if SETTINGS_PACKAGE in path.parents:
                continue
            out[path.relative_to(REPO_ROOT).as_posix()] = path.read_text(encoding="utf-8")
    return out


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


def test_every_variable_the_code_names_is_declared() -> None:
    """A SPLATQ_* name anywhere in shared/, services/ or the image's files is a declared
    setting (or listed in NOT_VARIABLES): the code cannot read, or tell an operator to set,
    an undocumented one."""
    sources = production_sources()
    for path in [REPO_ROOT / "Dockerfile", *sorted((REPO_ROOT / "docker").iterdir())]:
        sources[path.relative_to(REPO_ROOT).as_posix()] = path.read_text(encoding="utf-8")
    named: dict[str, set[str]] = {}
    for path, source in sources.items():
        for name in VARIABLE.findall(source):
            named.setdefault(name, set()).add(path)
    unknown = {n: sorted(p) for n, p in named.items() if n not in declared_variables()}
    assert set(unknown) <= NOT_VARIABLES, unknown
    assert set(named) >= NOT_VARIABLES, "an allowance no longer needed"


def test_only_the_allowed_modules_read_the_environment() -> None:
    readers = {p for p, source in production_sources().items() if ENVIRONMENT_READ.search(source)}
    assert readers == ENVIRONMENT_READERS


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
