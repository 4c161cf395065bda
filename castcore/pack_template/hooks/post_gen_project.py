"""After rendering: a pack of device profiles only (the ``estimators`` answer "no") loses the example estimators.

It deletes ``ops.py`` and its import, and keeps the profiles-only tests in place of the estimator tests. Runs
in the rendered pack's directory. The file stays valid Python before cookiecutter renders it.
"""

from __future__ import annotations

from pathlib import Path

ESTIMATORS = "{{ cookiecutter.estimators }}"
MODULE = Path("{{ cookiecutter.module_name }}")
TESTS = Path("tests")
IMPORT_OPS = "from . import ops  # noqa: F401  (importing ops declares its estimators and properties)\n"

if __name__ == "__main__":
    profiles_only = TESTS / "test_profiles_only.py"
    if ESTIMATORS == "no":
        (MODULE / "ops.py").unlink()
        init = MODULE / "__init__.py"
        init.write_text(init.read_text(encoding="utf-8").replace(IMPORT_OPS + "\n", ""), encoding="utf-8")
        profiles_only.replace(TESTS / "test_pack.py")
    else:
        profiles_only.unlink()
