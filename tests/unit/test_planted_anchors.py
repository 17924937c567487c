"""The planted-bug table (stress/planted/mutants.py) stays true to the code without planting
anything: each mutant's text is in the package exactly once and its broken form still parses,
the tests it names exist, and docs/TESTING.md lists every mutant. Planting them is
``python -m stress.planted`` (slow; not part of this suite)."""

from __future__ import annotations

import ast
import re

import pytest

from stress.planted.__main__ import ROOT, locate
from stress.planted.mutants import MUTANTS, Mutant

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_planted_text_is_in_the_package_once_and_its_broken_form_parses(mutant: Mutant) -> None:
    text = locate(mutant).read_text(encoding="utf-8")
    assert mutant.new != mutant.old and mutant.tests
    ast.parse(text.replace(mutant.old, mutant.new))


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_named_test_exists_in_the_fast_suite(mutant: Mutant) -> None:
    for test in mutant.tests:
        path, _, name = test.partition("::")
        assert path.startswith("tests/unit/"), test
        assert f"def {name}(" in (ROOT / path).read_text(encoding="utf-8"), test


def test_the_docs_list_every_mutant() -> None:
    text = (ROOT / "docs" / "TESTING.md").read_text(encoding="utf-8")
    listed = re.findall(r"\| `([a-z]+\.[\w-]+)`: ", text)
    assert sorted(listed) == sorted(m.name for m in MUTANTS)
