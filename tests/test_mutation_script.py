"""scripts/mutation.py's list of equivalent mutants follows a mutant when mutmut renumbers it.

mutmut numbers a function's mutants in order, so an edit of the function gives its
mutants new numbers: a name-only entry would then excuse whichever mutant took the
number. An entry that records its change matches by function and change instead.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]

DIFF = """\
--- scheduler_svc/engine/jobindex.py
+++ scheduler_svc/engine/jobindex.py
@@ -24,7 +24,7 @@
         for key in (r.primary, r.backup):
-            dev, _, port = key.partition("/")
+            dev, _, port = key.rpartition("/")
             used_ports.add((r.node, dev, int(port)))
"""
CHANGE = ('- dev, _, port = key.partition("/")', '+ dev, _, port = key.rpartition("/")')


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_script", ROOT / "scripts/mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_a_diff_reads_as_its_removed_and_added_lines() -> None:
    assert script().change_of(DIFF) == CHANGE


def test_entries_read_with_their_changes_and_write_back_alike(tmp_path: Path) -> None:
    m = script()
    text = (
        "# header\n"
        "pkg.mod.x_f__mutmut_3 device names hold no slash\n"
        f"    {CHANGE[0]}\n"
        f"    {CHANGE[1]}\n"
        "pkg.mod.x_g__mutmut_1 an older entry, by name alone\n"
    )
    entries = m.read_equivalents(text)
    assert entries == [
        m.Equivalent("pkg.mod.x_f__mutmut_3", "device names hold no slash", CHANGE),
        m.Equivalent("pkg.mod.x_g__mutmut_1", "an older entry, by name alone"),
    ]
    path = tmp_path / "equivalent.txt"
    path.write_text(text)
    m.write_equivalents(path, entries)
    assert path.read_text() == text


def test_an_entry_with_its_change_follows_the_mutant_and_no_other() -> None:
    m = script()
    entry = m.Equivalent("pkg.mod.x_f__mutmut_3", "why", CHANGE)
    assert m.match_equivalent("pkg.mod.x_f__mutmut_3", CHANGE, [entry]) is entry
    # Renumbered: the same change in the same function is still the listed mutant.
    assert m.match_equivalent("pkg.mod.x_f__mutmut_5", CHANGE, [entry]) is entry
    # The number now names another change: not excused.
    assert m.match_equivalent("pkg.mod.x_f__mutmut_3", ("- a", "+ b"), [entry]) is None
    # The same change in another function is another mutant.
    assert m.match_equivalent("pkg.mod.x_h__mutmut_3", CHANGE, [entry]) is None


def test_an_entry_by_name_alone_matches_that_name_only() -> None:
    m = script()
    entry = m.Equivalent("pkg.mod.x_g__mutmut_1", "why")
    assert m.match_equivalent("pkg.mod.x_g__mutmut_1", CHANGE, [entry]) is entry
    assert m.match_equivalent("pkg.mod.x_g__mutmut_2", CHANGE, [entry]) is None


def test_a_run_rewrites_its_section_and_keeps_the_notes_under_it() -> None:
    mu = script()
    old = (
        "# Results\n\n## Before\n\nkept\n\n## Test strength\n\n| old table |\n\n"
        "Notes on the rows (by hand):\n\n- engine: killed after.\n\n## After\n\nkept too\n"
    )
    new = mu.with_section(old, "## Test strength\n\n| new table |\n")
    assert new == (
        "# Results\n\n## Before\n\nkept\n\n## Test strength\n\n| new table |\n\n"
        "Notes on the rows (by hand):\n\n- engine: killed after.\n\n## After\n\nkept too\n"
    )
    # Last in the file, and without notes: the section alone.
    assert mu.with_section(
        "# R\n\n## Test strength\n\n| old |\n", "## Test strength\n\n| new |\n"
    ) == ("# R\n\n## Test strength\n\n| new |\n")
    # No section yet: appended.
    assert (
        mu.with_section("# R\n", "## Test strength\n\n| t |\n")
        == "# R\n\n## Test strength\n\n| t |\n"
    )


def test_a_score_is_rounded_down_so_a_survivor_never_reads_as_100() -> None:
    score = script().score
    assert score(4331, 4333) == 99.9
    assert score(73, 73) == 100.0
    assert score(57, 80) == 71.2
    assert score(0, 0) == 100.0  # nothing that could survive


def result(target: str, killed: int) -> dict[str, object]:
    return {
        "target": target,
        "files": ["x.py"],
        "tests": ["tests/x.py"],
        "mutants": killed + 1,
        "killed": killed,
        "equivalent": 0,
        "survived": 1,
        "score": 50.0,
        "survivors": [f"{target}.x_f__mutmut_1"],
        "minutes": 0.1,
        "date": "2026-12-06",
    }


def test_runs_of_two_targets_at_once_keep_each_others_results(tmp_path: Path) -> None:
    """Each run writes its result into the files as they are when it ends, not as they
    were when it began: the second to end keeps the first's row."""
    m = script()
    for name, path in (("RESULTS_JSON", "results.json"), ("RESULTS_MD", "RESULTS.md")):
        setattr(m, name, tmp_path / path)
    setattr(m, "SHARED_LOCK", tmp_path / "lock")  # noqa: B010  a module's constant
    m.RESULTS_MD.write_text("# Results\n")
    first, second = m.TARGETS[0].name, m.TARGETS[1].name
    m.record_result(result(first, 3))
    both = m.record_result(result(second, 5))
    assert {k: v["killed"] for k, v in both.items()} == {first: 3, second: 5}
    table = m.RESULTS_MD.read_text()
    assert f"| {first} |" in table and f"| {second} |" in table


def test_a_run_follows_its_entries_without_dropping_another_runs(tmp_path: Path) -> None:
    """A run renames the entry it matched in the equivalents file as it is now: an entry
    another run added meanwhile stays."""
    m = script()
    setattr(m, "SHARED_LOCK", tmp_path / "lock")  # noqa: B010  a module's constant
    path = tmp_path / "equivalent.txt"
    path.write_text("# header\nmod.x_f__mutmut_1 same either way\n")
    old = m.read_equivalents(path.read_text())[0]
    with path.open("a") as f:  # another run, meanwhile
        f.write("other.x_g__mutmut_2 another reason\n")
    m.follow_equivalents(path, [(old, m.Equivalent("mod.x_f__mutmut_4", old.reason, CHANGE))])
    entries = m.read_equivalents(path.read_text())
    assert [(e.name, e.change) for e in entries] == [
        ("mod.x_f__mutmut_4", CHANGE),
        ("other.x_g__mutmut_2", ()),
    ]
    assert path.read_text().startswith("# header\n")
