#!/bin/bash
# Two numbers in reward.json: "reward" is the one that counts, "lines" rides along.
lines=$(wc -l < /app/numbers.txt 2>/dev/null || echo 0)
if [ "$(cat /app/numbers.txt 2>/dev/null)" = "$(seq 1 3)" ]; then r=1.0; else r=0.0; fi
printf '{"reward": %s, "lines": %s}\n' "$r" "$lines" > /logs/verifier/reward.json
