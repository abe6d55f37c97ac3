#!/usr/bin/env bash
# The command line's error convention (docs/cli.md) through the real executable: a flag or
# command mistake is one stderr line "tierzero <command>: <what>" and exit 1 (CLI11's own codes
# were 104-114 with no prefix); a missing or unknown subcommand lists the valid ones; help and
# version still exit 0.
tz=$1
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
# expect NAME WANT ARGS...: exit 1, exactly one stderr line, starting with WANT.
expect() {
  local name=$1 want=$2; shift 2
  local err rc lines
  err=$("$tz" "$@" 2>&1 >/dev/null); rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -eq 1 ] && [ "$lines" -eq 1 ] && [ "${err#"$want"}" != "$err" ]; then
    ok "$name: $err"
  else
    bad "$name: rc=$rc lines=$lines (want 1, 1 line starting '$want'): $err"
  fi
}
expect no_command "tierzero: a command is required (one of: bench, ckpt, config, data, estimate, info, sample, train)"
expect unknown_command "tierzero: unknown command 'bogus' (one of: " bogus
expect bare_group "tierzero ckpt: a command is required (one of: info, export)" ckpt
expect unknown_subcommand "tierzero ckpt: unknown command 'frobnicate' (one of: info, export)" ckpt frobnicate
expect bad_number "tierzero train: " train --config x --model y --steps notanumber
expect missing_value "tierzero bench nvme: --bs" bench nvme --bs
expect unknown_flag "tierzero info: " info --no-such-flag
"$tz" --help > /dev/null 2>&1 && ok "--help exits 0" || bad "--help did not exit 0"
"$tz" ckpt --help > /dev/null 2>&1 && ok "ckpt --help exits 0" || bad "ckpt --help did not exit 0"
[ "$("$tz" --version)" = "tierzero 0.1.0" ] && ok "--version" || bad "--version"
exit $fail
