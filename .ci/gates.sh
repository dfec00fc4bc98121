#!/usr/bin/env bash
# Style and type gates (called by .ci/run after the test command, in the venv that command made):
# ruff (lint and format) over the Python, mypy (strict on planning/, typed signatures elsewhere: pyproject.toml),
# import-linter's contracts over heterps_paddle/ (the import layers, planning without Paddle, no cycles between
# packages: [tool.importlinter] in pyproject.toml), clang-format over the C++ and CUDA of custom_ops/.  The tools
# are pinned in setup.py's `test` extra.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
python_files=(heterps_paddle tests examples setup.py custom_ops)
echo "== gates: ruff check"
ruff check "${python_files[@]}"
echo "== gates: ruff format --check"
ruff format --check "${python_files[@]}"
echo "== gates: mypy"
mypy
echo "== gates: import layers (lint-imports)"
# Reads the package from the working tree (lint-imports puts the current directory first on sys.path), not the
# installed copy.
lint-imports --no-cache
echo "== gates: clang-format"
mapfile -t cxx < <(git ls-files 'custom_ops/*.cc' 'custom_ops/*.h' 'custom_ops/*.cu' 'custom_ops/*.cuh')
clang-format --dry-run --Werror "${cxx[@]}"
echo "== gates: passed"
