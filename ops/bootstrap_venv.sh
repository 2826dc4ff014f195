#!/usr/bin/env bash
# Create or refresh the controller/test venv: host runtime + converter + controller + test extras.
set -euo pipefail
venv=${1:-.venv}
if ! command -v python3 >/dev/null; then
    echo "python3 not found: apt-get install python3 python3-venv" >&2; exit 1
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv" || {
    echo "could not create $venv: apt-get install python3-venv" >&2; exit 1; }
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -e '.[host,converter,controller,test]'
# optimum-intel pulls torchvision, whose PyPI build fails to import beside the CPU torch and breaks
# transformers imports (pyproject.toml, the converter extra); nothing here needs it.
"$venv/bin/python" -m pip uninstall -y -q torchvision 2>/dev/null || true
