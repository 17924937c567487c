"""``python -m stress.planted``: plant known bugs in the critical checks and expect a fast unit test
to fail for each (a hand-picked mutation check; docs/TESTING.md, "What the fast tests guard").

::

    for each mutant of mutants.MUTANTS (a check, an exact text in the package, its broken form):
        find the text (its file, else the one package file that holds it once)
        write the broken form ── run its named unit tests (pytest -x) ── restore the file
        caught: a test failed    missed: every test passed    stale: the text is gone

Not part of the normal test run: each mutant starts a pytest process.
"""
