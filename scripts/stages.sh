# Sourced by .ci/run and scripts/test.sh: times the stages of a run, so the next slow stage is
# visible to whoever adds it.
#   stage NAME     ends the stage before (if any), prints "== NAME" and starts timing NAME
#   stage_table    ends the current stage and prints every stage's seconds and the total
_stages=()
_stage_name=""
_stage_t0=$SECONDS
_stages_t0=$SECONDS

_stage_end() {
  if [[ -n "$_stage_name" ]]; then
    _stages+=("$((SECONDS - _stage_t0))|$_stage_name")
    _stage_name=""
  fi
}

stage() {
  _stage_end
  _stage_name="$1"
  _stage_t0=$SECONDS
  echo "== $1"
}

stage_table() {
  _stage_end
  local s
  echo "stage times (${STAGES_TITLE:-this run}):"
  for s in "${_stages[@]}"; do
    printf '  %5d s  %s\n' "${s%%|*}" "${s#*|}"
  done
  printf '  %5d s  in all\n' "$((SECONDS - _stages_t0))"
}
