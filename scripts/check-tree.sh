#!/usr/bin/env bash
# The tracked tree stays small enough to travel to a lent GPU (the device tool takes 64 MiB a
# call, binaries included): at most 44 MiB (`git ls-files -z | xargs -0 du -cb`), and no file
# committed twice (same blob at two paths; symbolic links, which share their target's text,
# aside). Fails naming the largest files, or the duplicates.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
limit=$((44 * 1024 * 1024))
total=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
printf 'tracked tree: %d bytes (%.1f MiB; limit 44 MiB)\n' "$total" "$(awk -v b="$total" 'BEGIN { print b / 1048576 }')"
status=0
if ((total > limit)); then
  echo "check-tree: the tracked tree is over 44 MiB; its largest files:" >&2
  git ls-files -z | xargs -0 du -b | sort -rn | head -15 >&2
  status=1
fi
dups=$(git ls-files -s | awk '$1 != "120000" { paths[$2] = paths[$2] " " $4; n[$2]++ }
  END { for (b in n) if (n[b] > 1) print "  " b ":" paths[b] }')
if [[ -n "$dups" ]]; then
  echo "check-tree: files committed twice (link one to the other):" >&2
  echo "$dups" >&2
  status=1
fi
exit $status
