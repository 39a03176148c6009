#!/bin/bash
# Harbor reads /logs/verifier/reward.json first.
if [ "$(cat /app/hello.txt 2>/dev/null)" = 'harbor-gemini-ok' ]; then r=1; else r=0; fi
printf '{"reward": %s}\n' "$r" > /logs/verifier/reward.json
