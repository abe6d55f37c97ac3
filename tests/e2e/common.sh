# Shared by the train e2e scripts: a scratch directory, a tiny corpus and config writer.
set -u
work=$(mktemp -d "${TMPDIR:-/tmp}/tz-e2e.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
model="gpt2:layers=2,heads=2,embd=32,vocab=256,seq=32"
# A few KiB of English-like text (repeated sentences with a counter, so it is not periodic).
make_text() {
  for i in $(seq 1 200); do echo "The quick brown fox $i jumps over the lazy dog; line $i of the test text."; done > "$1"
}
# config FILE STAGE OPTIMIZER_DEVICE PARAM_DEVICE [extra top-level json]
config() {
  local opt="" par=""
  [ "$3" != none ] && opt=", \"offload_optimizer\": {\"device\": \"$3\"}"
  [ "$4" != none ] && par=", \"offload_param\": {\"device\": \"$4\"}"
  cat > "$1" <<JSON
{
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 1.0,
  "steps_per_print": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
  "zero_optimization": {"stage": $2 $opt $par}${5:-}
}
JSON
}
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
