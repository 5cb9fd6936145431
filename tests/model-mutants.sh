#!/usr/bin/env bash
# Breaks the Lua scripts on purpose, one rule at a time, and checks that the
# model test (tests/store/model.rs) catches each break: a model test that passes
# whatever the scripts do would prove nothing. Restores every script after
# each run, also on Ctrl-C. Takes a few minutes (the host library is rebuilt
# for each mutant, since the scripts are compiled in).
#
#   bash tests/model-mutants.sh            # every mutant
#   HOURGLASS_MODEL_CASES=500 bash ...     # fewer cases per mutant
#   HOURGLASS_MUTANTS=held bash ...        # only the mutants whose names contain "held"
set -euo pipefail
cd "$(dirname "$0")/.."
scripts=host/store/src/scripts
export HOURGLASS_MODEL_CASES="${HOURGLASS_MODEL_CASES:-3000}"

# name | file | sed expression that breaks one rule
mutants=(
  "settle ignores fencing (a lapsed lease's outcome is applied)|prelude.lua|s/  if k < 1 or live_bytes(rec)\[k\] ~= LIVE then return nil end/  if k < 1 then return nil end/"
  "extend revives a reaped lease|extend.lua|s/  if leased_in(recs, claimed, c, id, token) then/  if true then/"
  "a reaped lease's attempt is not counted|claim.lua|s/      if lost_attempts\[i\] then/      if false then/"
  "a reaped task overwrites a client's new schedule|claim.lua|s/  each_chunk(zpairs, function(...) redis.call('ZADD', due, 'NX', ...) end)/  each_chunk(zpairs, function(...) redis.call('ZADD', due, ...) end)/"
  "a cancelled run whose host died runs again|claim.lua|s/    if lost_tokens\[i\] and marks\[i\] == lost_tokens\[i\] then/    if false then/"
  "max_running is not enforced|claim.lua|s/  if room < limit then/  if false then/"
  "a failed run whose cancel was asked is retried|settle.lua|s/  if kind ~= 'ack' and kind ~= 'cancel' and has_cancels and redis.call('HGET', cancels, id) == token then/  if false then/"
  "an ack drops the payload of a task scheduled again meanwhile|settle.lua|s/        if not due_score then drop_payload\[#drop_payload + 1\] = id end/        drop_payload[#drop_payload + 1] = id/"
  "release overwrites a client's new schedule|release.lua|s/each_chunk(back, function(...) redis.call('ZADD', due, 'NX', ...) end)/each_chunk(back, function(...) redis.call('ZADD', due, ...) end)/"
  "a claim hands out an id whose earlier run still holds its lease|claim.lua|s/^  if added < expected then/  if false then/"
  "a schedule held for a run keeps the lease's end when the run settles|settle.lua|s/^  unhold(held, due, left)/  local _ = left/"
  "a dead letter a client's schedule overrode is reported as dead|settle.lua|s/^          outcome = 'rescheduled'$/          outcome = 'dead'/"
)

backup=$(mktemp -d)
cp "$scripts"/*.lua "$backup"/
restore() { cp "$backup"/*.lua "$scripts"/; }
trap 'restore; rm -rf "$backup"' EXIT

missed=0
for m in "${mutants[@]}"; do
  IFS='|' read -r name file expr <<<"$m"
  [[ "$name" == *"${HOURGLASS_MUTANTS:-}"* ]] || continue
  sed -i "$expr" "$scripts/$file"
  if cmp -s "$scripts/$file" "$backup/$file"; then
    echo "error: the mutant '$name' no longer applies to $file: update this script" >&2
    exit 2
  fi
  if out=$(cargo test --workspace --test store model::the_scripts_agree 2>&1); then
    echo "NOT CAUGHT: $name"
    missed=$((missed + 1))
  elif grep -q "disagree" <<<"$out"; then
    echo "caught:     $name"
    grep -m1 -A0 "^step\|^after step" <<<"$out" | sed 's/^/            /'
  else
    echo "error: the model test failed for another reason with '$name':" >&2
    tail -20 <<<"$out" >&2
    exit 2
  fi
  restore
done
((missed == 0)) || { echo "$missed mutant(s) not caught" >&2; exit 1; }
echo "every mutant caught"
