# shellcheck shell=bash
# The Python peers' environment, shared by the bench scripts that compare tierzero with PyTorch,
# transformers, PEFT, tokenizers and DeepSpeed (through bench/common.sh, which sources it): one
# throw-away virtual environment under build/ (never in CI), created and filled on first use.
# Source it, then call peers_venv_need once per group of packages.
#
#   peers_venv_need VENV WHO "IMPORTS" PIP_ARGS...
#     Makes VENV/bin/python able to `import IMPORTS` (comma-separated modules), creating VENV with
#     python3 -m venv when missing and running `pip install -q PIP_ARGS...` when the import fails.
#     WHO names the calling script in messages. Returns 0 when the modules import, 1 otherwise
#     (the reason on stderr, pip's output in VENV.install.log). A group whose install failed once
#     is not retried on later runs (installs take minutes and need PyPI): the marker
#     VENV/.tz-install-failed.<first module> says so; delete it to try again.
#     Several scripts may run at once: creation and installs hold an flock on VENV.lock.
#   peers_python VENV  prints the interpreter's path.

peers_python() { echo "$1/bin/python"; }

peers_venv_need() {
  local venv="$1" who="$2" imports="$3"
  shift 3
  local py="$venv/bin/python"
  local marker="$venv/.tz-install-failed.${imports%%,*}"
  marker="${marker// /}"
  if [[ -x "$py" ]] && "$py" -c "import $imports" 2>/dev/null; then return 0; fi
  if [[ -e "$marker" ]]; then
    echo "$who: $imports not installed in $venv (an earlier install failed, see $venv.install.log; rm $marker to retry)" >&2
    return 1
  fi
  mkdir -p "$(dirname "$venv")"
  (
    # One installer at a time; a second script waits here, then finds the modules in place.
    flock 9
    if [[ -x "$py" ]] && "$py" -c "import $imports" 2>/dev/null; then exit 0; fi
    if [[ ! -x "$py" ]]; then
      echo "$who: creating $venv (python3 -m venv)" >&2
      python3 -m venv "$venv" || { echo "$who: python3 -m venv $venv failed" >&2; exit 1; }
      if "$py" -c "import $imports" 2>/dev/null; then exit 0; fi
    fi
    echo "$who: installing $* into $venv from PyPI (may take minutes and GBs)" >&2
    if ! "$venv/bin/pip" install -q "$@" >> "$venv.install.log" 2>&1 ||
       ! "$py" -c "import $imports" 2>> "$venv.install.log"; then
      : > "$marker"
      echo "$who: installing $* failed, see $venv.install.log:" >&2
      tail -5 "$venv.install.log" >&2
      exit 1
    fi
  ) 9> "$venv.lock"
}
