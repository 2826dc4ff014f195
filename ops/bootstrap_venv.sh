#!/usr/bin/env bash
# Create or refresh the controller/test venv: host runtime + converter + controller + test extras.
#   bash ops/bootstrap_venv.sh [VENV]               create or refresh VENV (default .venv)
#   bash ops/bootstrap_venv.sh --torch-dry-run VENV  only say which torch wheel it would install, and from where
# torch comes as its CPU build: on x86_64, PyPI's torch is the CUDA build, several GB of NVIDIA libraries a CPU
# host never uses. When pip's own configuration resolves the pin to a CPU build (+cpu), that is used as it is;
# otherwise the CPU wheel index is added: VLFLEET_TORCH_INDEX (default PyTorch's, below) or a mirror of it.
set -euo pipefail
dry_run=
if [ "${1:-}" = --torch-dry-run ]; then dry_run=1; shift; fi
venv=${1:-.venv}
repo=$(cd "$(dirname "$0")/.." && pwd)
torch_index=${VLFLEET_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
torch_pin=$(grep -o '"torch==[^"]*"' "$repo/pyproject.toml" | tr -d '"')
if ! command -v python3 >/dev/null; then
    echo "python3 not found: apt-get install python3 python3-venv" >&2; exit 1
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv" || {
    echo "could not create $venv: apt-get install python3-venv" >&2; exit 1; }
pip() { "$venv/bin/python" -m pip "$@"; }
[ -n "$dry_run" ] || pip install -q --upgrade pip

# The URL of the wheel pip resolves "$torch_pin" to, with these extra arguments (a dry run: downloads metadata only).
torch_wheel() {
    pip install -q --dry-run --no-deps --ignore-installed --report - "$@" "$torch_pin" |
        "$venv/bin/python" -c 'import json, sys, urllib.parse as u
print(*(u.unquote(i["download_info"]["url"]) for i in json.load(sys.stdin)["install"]))'
}
cpu_build() { case "$1" in *+cpu-*) return 0;; *) return 1;; esac; }

torch_args=()
if [ "$(uname -m)" = x86_64 ]; then  # elsewhere (aarch64) PyPI's torch is the CPU build
    wheel=$(torch_wheel)
    if ! cpu_build "$wheel"; then
        torch_args=(--extra-index-url "$torch_index")
        wheel=$(torch_wheel "${torch_args[@]}")
        cpu_build "$wheel" || {
            echo "$torch_pin resolves to ${wheel:-nothing}, not a CPU build, even with $torch_index: set" \
                 "VLFLEET_TORCH_INDEX to an index (or mirror) that holds ${torch_pin#torch==}+cpu" >&2; exit 1; }
    fi
    echo "torch: ${wheel##*/}${torch_args[*]:+ (from $torch_index)}"
    [ -n "$dry_run" ] && exit 0
    pip install -q "${torch_args[@]}" "$torch_pin"
elif [ -n "$dry_run" ]; then
    echo "torch: from pip's configured index ($(uname -m) builds are CPU-only)"; exit 0
fi
pip install -q -e "$repo[host,converter,controller,test]"
# optimum-intel pulls torchvision, whose PyPI build fails to import beside the CPU torch and breaks
# transformers imports (pyproject.toml, the converter extra); nothing here needs it.
pip uninstall -y -q torchvision 2>/dev/null || true
